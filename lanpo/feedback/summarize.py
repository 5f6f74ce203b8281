"""Distilling successful rollouts into experiences: choose which to summarise (over the whole step, across ranks),
then one batched generation.

The summariser is the policy itself (paper default) or a separate model named in `summarizer.model`. It sees the
problem and the successful response, never a reward; the template asks for an abstract lesson (flow of thought,
principles, pitfalls) rather than a copy of the problem's steps.

Scaffolded summaries (`summarizer.scaffold`): the code writes each header of the lesson (## Flow, ## Principles,
## Pitfalls) into the assistant's turn, and the model writes only that section's body, which ends at the next
header or a blank line (stop strings). One batched generation per section, each prompt continuing the turn as it
stands. The format is then the code's, the content the model's: the same admission check decides, so a section
that echoes the prompt or is empty is still refused. This is for weak summarisers (a 135M policy writes no header
of its own, or the prompt's placeholder hints under them); a model that writes the lesson whole needs none.

Admission: a summary shorter than MIN_SUMMARY_CHARS is never a lesson (`short`); one that repeats its problem's
final answer or its numbers of two or more digits (the summary prompt's own rule: "do not repeat this problem's
numbers or its final result"; `lanpo.prompts.repeated_numbers`) is not admitted (`repeats`); one without the
lesson's format (`lanpo.prompts.has_summary_format`: the three headers, each with words of its own under it) is not
admitted either (`format`) unless `summarizer.require_format = false`. Every generated summary says whether it had
the format, so a step can report the share that did and how many were turned away, by reason.

`summaries_of` does it all for one process's rollouts of a step; lanpo's trainer hands it the cross-rank choice
(`lanpo.train.producer.summarize.choose_for_step`), any other trainer lets it choose among its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lanpo.feedback.config import SummarizerConfig
from lanpo.feedback.contexts import StepPrompts, per_rollout
from lanpo.feedback.schedule import mix_seed
from lanpo.models import apply_chat
from lanpo.prompts import SUMMARY_HEADERS, has_summary_format, repeated_numbers, summary_messages
from lanpo.rewards import Graded
from lanpo.rollout import Completion, GenerationBackend, SamplingParams

MIN_SUMMARY_CHARS = 20
REJECTIONS = ("short", "repeats", "format")  # why a generated summary is not admitted to the pool, checked in order
SECTION_STOP = ("\n\n", "\n#")  # a scaffolded section's body ends at a blank line or the next heading


@dataclass(frozen=True)
class Candidate:
    """A successful rollout: its index in the step's flat rollout list, problem, and texts."""

    index: int
    problem_id: int
    question: str
    response: str
    reward: float
    answer: str | None = None  # the problem's final answer: a summary that repeats it is not admitted


def choose_candidates(candidates: Sequence[Candidate], per_problem: int, total: int = 0) -> list[Candidate]:
    """Distinct responses, at most `per_problem` per problem, then at most `total` overall (0: no limit); in index
    order.

    Within a problem the best reward comes first, then the earlier rollout. The total cap takes problems
    round-robin in the step's order (a problem's place is its first candidate's index: rollouts are numbered in
    prompt order, and the step's batch is a seeded shuffle of the training set): one lesson of each problem before
    a second of any, so that one easy problem does not fill the cap, and no problem is favoured step after step by
    its id.
    """
    by_problem: dict[int, list[Candidate]] = {}
    for cand in sorted(candidates, key=lambda c: (-c.reward, c.index)):
        picked = by_problem.setdefault(cand.problem_id, [])
        if len(picked) < per_problem and all(p.response.strip() != cand.response.strip() for p in picked):
            picked.append(cand)
    first: dict[int, int] = {}  # problem -> the index of its first rollout: its place in the step
    for cand in candidates:
        first[cand.problem_id] = min(first.get(cand.problem_id, cand.index), cand.index)
    queues = [list(by_problem[pid]) for pid in sorted(by_problem, key=first.__getitem__)]
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
    # what writing it cost (the step's cost/* metrics): the tokens generated, and the prompt tokens each generation
    # call read (scaffolded: one call per section, each reading the prompt and the sections before it)
    generated_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def admitted(self) -> str | None:
        """The text the pool takes, or None when the summary was turned away."""
        return None if self.rejected else self.text


def check_summary(text: str, require_format: bool = True, question: str = "", answer: str | None = None) -> Summary:
    """Strip a generated summary and decide its admission: too short never, repeating its problem (`question`,
    `answer`) never, without the format only when `require_format` is off."""
    text = text.replace("\x00", "").strip()
    format_ok = has_summary_format(text)
    rejected = None
    if len(text) < MIN_SUMMARY_CHARS:
        rejected = "short"
    elif repeated_numbers(text, question, answer):
        rejected = "repeats"
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
    scaffold: bool = False,
) -> list[Summary]:
    """One checked summary per candidate, batched: one generation call, or one per section when `scaffold`
    (`Summary.admitted` is what the pool takes), each with the tokens it generated and read."""
    if not candidates:
        return []
    prompts = [apply_chat(tokenizer, summary_messages(c.question, c.response)) for c in candidates]
    if scaffold:
        texts, generated, read = scaffolded(backend, prompts, SUMMARY_HEADERS, max_new_tokens, temperature, seed)
    else:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=seed)
        outputs = [group[0] for group in backend.generate(prompts, 1, params)]
        texts = [c.text for c in outputs]
        generated, read = [len(c.token_ids) for c in outputs], [len(c.prompt_token_ids) for c in outputs]
    return [
        replace(check_summary(t, require_format, c.question, c.answer), generated_tokens=g, prompt_tokens=r)
        for t, c, g, r in zip(texts, candidates, generated, read, strict=True)
    ]


def scaffolded(
    backend: GenerationBackend,
    prompts: Sequence[str],
    headers: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> tuple[list[str], list[int], list[int]]:
    """Each prompt's reply written section by section: the code writes a header, the model its body (up to
    `SECTION_STOP`, `max_new_tokens // len(headers)` tokens at most), and the next header follows on a line of its
    own. One batched call per section; the bodies are the model's, stripped. Returns the replies, and per prompt
    the tokens its calls generated and the prompt tokens they read (the headers are prompt, not generated)."""
    budget = max(1, max_new_tokens // len(headers))
    written = ["" for _ in prompts]
    generated, read = [0 for _ in prompts], [0 for _ in prompts]
    for number, header in enumerate(headers):
        written = [f"{w}{header}\n" for w in written]
        params = SamplingParams(
            max_new_tokens=budget, temperature=temperature, top_p=1.0, seed=seed + number, stop=SECTION_STOP
        )
        groups = backend.generate([p + w for p, w in zip(prompts, written, strict=True)], 1, params)
        written = [f"{w}{group[0].text.strip()}\n" for w, group in zip(written, groups, strict=True)]
        generated = [g + len(group[0].token_ids) for g, group in zip(generated, groups, strict=True)]
        read = [r + len(group[0].prompt_token_ids) for r, group in zip(read, groups, strict=True)]
    return [w.rstrip("\n") for w in written], generated, read


Chooser = Callable[[list[Candidate], int, int], list[Candidate]]  # (candidates, per problem, total) -> chosen


def summaries_of(
    cfg: SummarizerConfig,
    backend: GenerationBackend,
    tokenizer: Any,
    seed: int,
    step: int,
    prompts: StepPrompts,
    rollouts: list[Completion],
    graded: list[Graded],
    rank: int = 0,
    world: int = 1,
    choose: Chooser = choose_candidates,
) -> dict[int, Summary]:
    """Summaries of this process's successful rollouts (reward >= `cfg.min_reward`), chosen by `choose` and checked
    for admission (flat rollout index -> summary). `rollouts` are n per prompt of `prompts`, group by group; `rank`
    of `world` processes numbers them within the step (prompt g of rank r is the step's prompt r + world * g)."""
    n = len(rollouts) // max(len(prompts.problem_ids), 1)
    step_index = [(rank + world * (i // n)) * n + i % n for i in range(len(rollouts))]  # in the whole step
    pids, questions, answers = (per_rollout(v, n) for v in (prompts.problem_ids, prompts.questions, prompts.answers))
    candidates = [
        Candidate(step_index[i], pids[i], questions[i], c.text, g.reward, answers[i])
        for i, (c, g) in enumerate(zip(rollouts, graded, strict=True))
        if g.reward >= cfg.min_reward
    ]
    chosen = choose(candidates, cfg.max_new_per_step, cfg.max_total_per_step)
    local = {j: i for i, j in enumerate(step_index)}
    checked = summarise(
        backend,
        tokenizer,
        chosen,
        cfg.max_new_tokens,
        cfg.temperature,
        mix_seed(seed, "summarize", step, rank),
        cfg.require_format,
        cfg.scaffold,
    )
    return {local[c.index]: s for c, s in zip(chosen, checked, strict=True)}
