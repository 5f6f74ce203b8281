"""Distilling successful rollouts into experiences: choose which to summarise, then one batched generation.

The summariser is the policy itself (paper default) or a separate model named in `summarizer.model`. It sees the
problem and the successful response, never a reward; the template asks for an abstract lesson (flow of thought,
principles, pitfalls) rather than a copy of the problem's steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lanpo.models import apply_chat
from lanpo.prompts import summary_messages
from lanpo.rollout import GenerationBackend, SamplingParams

MIN_SUMMARY_CHARS = 20


@dataclass(frozen=True)
class Candidate:
    """A successful rollout: its index in the step's flat rollout list, problem, and texts."""

    index: int
    problem_id: int
    question: str
    response: str
    reward: float


def choose_candidates(candidates: Sequence[Candidate], per_problem: int, total: int = 0) -> list[Candidate]:
    """Distinct responses, at most `per_problem` per problem, then at most `total` overall (0: no limit).

    The total cap takes problems round-robin so one easy problem does not fill it.
    """
    by_problem: dict[int, list[Candidate]] = {}
    for cand in sorted(candidates, key=lambda c: (-c.reward, c.index)):
        picked = by_problem.setdefault(cand.problem_id, [])
        if len(picked) < per_problem and all(p.response.strip() != cand.response.strip() for p in picked):
            picked.append(cand)
    queues = [list(v) for _, v in sorted(by_problem.items())]
    out: list[Candidate] = []
    while any(queues) and (total == 0 or len(out) < total):
        for queue in queues:
            if queue and (total == 0 or len(out) < total):
                out.append(queue.pop(0))
    return sorted(out, key=lambda c: c.index)


def clean_summary(text: str) -> str | None:
    """Strip the generated summary; None when it is too short to be a lesson."""
    text = text.replace("\x00", "").strip()
    return text if len(text) >= MIN_SUMMARY_CHARS else None


def summarise(
    backend: GenerationBackend,
    tokenizer: Any,
    candidates: Sequence[Candidate],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[str | None]:
    """One summary (or None) per candidate, from one batched generation call."""
    if not candidates:
        return []
    prompts = [apply_chat(tokenizer, summary_messages(c.question, c.response)) for c in candidates]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)
    outputs = backend.generate(prompts, 1, params)
    return [clean_summary(group[0].text) for group in outputs]
