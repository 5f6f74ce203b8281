"""Distilling successful rollouts into experiences: choose which to summarise, then one batched generation.

The summariser is the policy itself (paper default) or a separate model named in `summarizer.model`. It sees the
problem and the successful response, never a reward; the template asks for an abstract lesson (flow of thought,
principles, pitfalls) rather than a copy of the problem's steps.

Admission: a summary shorter than MIN_SUMMARY_CHARS is never a lesson (`short`); one without the lesson's format
(`lanpo.prompts.has_summary_format`: the three headers, each with words of its own under it) is not admitted either
(`format`) unless `summarizer.require_format = false`. Every generated summary says whether it had the format, so a
step can report the share that did and how many were turned away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lanpo.models import apply_chat
from lanpo.prompts import has_summary_format, summary_messages
from lanpo.rollout import GenerationBackend, SamplingParams

MIN_SUMMARY_CHARS = 20
REJECTIONS = ("short", "format")  # why a generated summary is not admitted to the pool


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


@dataclass(frozen=True)
class Summary:
    """A generated summary: its stripped text, whether it has the lesson's format, and why it is not admitted."""

    text: str
    format_ok: bool
    rejected: str | None = None  # None: admitted to the pool; else one of REJECTIONS

    @property
    def admitted(self) -> str | None:
        """The text the pool takes, or None when the summary was turned away."""
        return None if self.rejected else self.text


def check_summary(text: str, require_format: bool = True) -> Summary:
    """Strip a generated summary and decide its admission: too short never, without the format only when
    `require_format` is off."""
    text = text.replace("\x00", "").strip()
    format_ok = has_summary_format(text)
    rejected = None
    if len(text) < MIN_SUMMARY_CHARS:
        rejected = "short"
    elif require_format and not format_ok:
        rejected = "format"
    return Summary(text, format_ok, rejected)


def summarise(
    backend: GenerationBackend,
    tokenizer: Any,
    candidates: Sequence[Candidate],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    require_format: bool = True,
) -> list[Summary]:
    """One checked summary per candidate, from one batched generation call (`Summary.admitted` is what the pool
    takes)."""
    if not candidates:
        return []
    prompts = [apply_chat(tokenizer, summary_messages(c.question, c.response)) for c in candidates]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)
    outputs = backend.generate(prompts, 1, params)
    return [check_summary(group[0].text, require_format) for group in outputs]
