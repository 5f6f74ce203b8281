"""The answer modes of the answerer: zero-shot, retrieval-augmented and self-correction (paper 4.3).

Each mode answers one batch of questions through a `Prompter` (what a mode reads of the answerer: its backend,
chat template and retrieval) and grades every turn against the gold answer when there is one. The modes
themselves are described in `lanpo.inference.answerer`'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from lanpo import prompts
from lanpo.db.repo.problems import Question
from lanpo.inference.config import RetrievalSettings
from lanpo.inference.results import Sample, Solution, Turn, UsedExperience
from lanpo.rewards import extract_boxed, format_ok, is_correct, reward_of
from lanpo.rollout import Completion, GenerationBackend, SamplingParams

EMPTY_POOL = "empty pool: the experience store holds no active experience, answered zero-shot"
NOTHING_RELEVANT = "no experience reached relevance gamma={gamma}: answered zero-shot"


def nothing_relevant(r: RetrievalSettings) -> str:
    """Why retrieval in a non-empty pool gave no experience, as the settings `r` tell it: gamma filters only what a
    judge scored (judge `none`: stage 1's candidates go in as they are), and `rank = value` leaves lessons out."""
    if r.judge == "none":
        why = f"stage 1 ({r.stage1}) found no experience for the question (no judge: gamma does not apply)"
    else:
        why = NOTHING_RELEVANT.removesuffix(": answered zero-shot").format(gamma=r.gamma)
    if r.rank == "value":
        why += f", or rank = value left out each one whose value is below {r.value_bound}"
    return f"{why}: answered zero-shot"


class Prompter(Protocol):
    """What a mode uses of the answerer (`lanpo.inference.answerer.Answerer`)."""

    backend: GenerationBackend
    retrieval: RetrievalSettings

    def render(self, messages: list[dict[str, str]]) -> str: ...

    def retrieve(self, chunk: Sequence[Question]) -> list[list[UsedExperience]]: ...


@dataclass(frozen=True)
class _Earlier:
    """What the reflection prompt reads of the first turn: its response text and nothing else."""

    response: str


def answer_batch(
    answerer: Prompter, mode: str, chunk: list[Question], k: int, params: SamplingParams, pool_empty: bool
) -> list[Solution]:
    """One batch of questions answered `k` times in `mode` (a normalised mode name)."""
    if mode == "zero_shot":
        return zero_shot(answerer, chunk, k, params)
    if mode == "retrieval":
        return retrieval(answerer, chunk, k, params, pool_empty)
    return self_correct(answerer, chunk, k, params, two_turn=mode == "self_correct")


def generate_turns(
    answerer: Prompter,
    prompts_: list[str],
    n: int,
    params: SamplingParams,
    versions: list[str],
    grade_modes: list[str],
    golds: list[str | None],
) -> list[list[Turn]]:
    """`n` graded turns for each prompt."""
    groups = answerer.backend.generate(prompts_, n, params)
    return [
        [grade_turn(p, c, v, gm, g) for c in group]
        for p, group, v, gm, g in zip(prompts_, groups, versions, grade_modes, golds, strict=True)
    ]


def grade_turn(prompt: str, completion: Completion, version: str, grade_mode: str, gold: str | None) -> Turn:
    """A completion as a Turn: its answer, format and (with a gold answer) correctness and reward."""
    text = completion.text
    fmt = format_ok(text, grade_mode)
    correct = None if gold is None else is_correct(text, gold)
    reward = None if correct is None else reward_of(correct, fmt)
    return Turn(
        prompt=prompt,
        response=text,
        prompt_version=version,
        prompt_tokens=len(completion.prompt_token_ids),
        completion_tokens=len(completion.token_ids),
        finish_reason=completion.finish_reason,
        answer=extract_boxed(text),
        correct=correct,
        reward=reward,
        format_ok=fmt,
        served_adapter_sha256=completion.served_adapter_sha256,
    )


def zero_shot(answerer: Prompter, chunk: list[Question], k: int, params: SamplingParams) -> list[Solution]:
    texts = [answerer.render(prompts.actor_messages(q.question)) for q in chunk]
    groups = generate_turns(
        answerer,
        texts,
        k,
        params,
        [prompts.ACTOR_VERSION] * len(chunk),
        ["zero_shot"] * len(chunk),
        [q.answer for q in chunk],
    )
    return [Solution(q, "zero_shot", [Sample([t]) for t in g]) for q, g in zip(chunk, groups, strict=True)]


@dataclass(frozen=True)
class Prepared:
    """One question's prompt in retrieval mode: the inter-sample prompt over its experiences, or the zero-shot
    prompt with the reason (`fallback`) when it has none."""

    prompt: str
    version: str
    grade_mode: str
    experiences: list[UsedExperience]
    fallback: str | None


def retrieval_prompt(answerer: Prompter, q: Question, exps: list[UsedExperience], pool_empty: bool) -> Prepared:
    """The prompt `lanpo infer --mode retrieval` answers `q` with, given the experiences retrieved for it."""
    if exps:
        text = answerer.render(prompts.inter_messages(q.question, exps))
        return Prepared(text, prompts.INTER_VERSION, "inter", list(exps), None)
    text = answerer.render(prompts.actor_messages(q.question))
    reason = EMPTY_POOL if pool_empty else nothing_relevant(answerer.retrieval)
    return Prepared(text, prompts.ACTOR_VERSION, "zero_shot", [], reason)


def retrieval(
    answerer: Prompter, chunk: list[Question], k: int, params: SamplingParams, pool_empty: bool
) -> list[Solution]:
    used = [[] for _ in chunk] if pool_empty else answerer.retrieve(chunk)
    ready = [retrieval_prompt(answerer, q, exps, pool_empty) for q, exps in zip(chunk, used, strict=True)]
    groups = generate_turns(
        answerer,
        [p.prompt for p in ready],
        k,
        params,
        [p.version for p in ready],
        [p.grade_mode for p in ready],
        [q.answer for q in chunk],
    )
    return [
        Solution(q, "retrieval", [Sample([t]) for t in g], p.experiences, p.fallback)
        for q, g, p in zip(chunk, groups, ready, strict=True)
    ]


def reflection_prompt(answerer: Prompter, q: Question, response: str, two_turn: bool) -> str:
    """Turn 2 of self-correction over one first attempt, from that attempt's response text alone (`_Earlier` holds
    nothing else): the same conversation continued (two-turn), or a fresh reflection prompt (single)."""
    earlier = _Earlier(response)
    if two_turn:
        return answerer.render(prompts.self_correct_messages(q.question, earlier))
    return answerer.render(prompts.intra_messages(q.question, [earlier]))


def self_correct(
    answerer: Prompter, chunk: list[Question], k: int, params: SamplingParams, two_turn: bool
) -> list[Solution]:
    golds = [q.answer for q in chunk]
    first = generate_turns(
        answerer,
        [answerer.render(prompts.actor_messages(q.question)) for q in chunk],
        k,
        params,
        [prompts.ACTOR_VERSION] * len(chunk),
        ["zero_shot"] * len(chunk),
        golds,
    )
    second_prompts, second_golds = [], []
    for q, group in zip(chunk, first, strict=True):
        for turn in group:
            second_prompts.append(reflection_prompt(answerer, q, turn.response, two_turn))
            second_golds.append(q.answer)
    n = len(second_prompts)
    version = prompts.REFLECT_VERSION if two_turn else prompts.INTRA_VERSION
    second = generate_turns(answerer, second_prompts, 1, params, [version] * n, ["intra"] * n, second_golds)
    solutions, flat = [], iter(second)
    mode = "self_correct" if two_turn else "self_correct_single"
    for q, group in zip(chunk, first, strict=True):
        samples = [Sample([turn, next(flat)[0]]) for turn in group]
        solutions.append(Solution(q, mode, samples))
    return solutions
