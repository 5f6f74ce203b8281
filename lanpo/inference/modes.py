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
from lanpo.inference.config import RetrievalSettings
from lanpo.inference.io import Question
from lanpo.inference.results import Sample, Solution, Turn, UsedExperience
from lanpo.rewards import extract_boxed, format_ok, is_correct, reward_of
from lanpo.rollout import Completion, GenerationBackend, SamplingParams

EMPTY_POOL = "empty pool: the experience store holds no active experience, answered zero-shot"
NOTHING_RELEVANT = "no experience reached relevance gamma={gamma}: answered zero-shot"


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


def retrieval(
    answerer: Prompter, chunk: list[Question], k: int, params: SamplingParams, pool_empty: bool
) -> list[Solution]:
    used = [[] for _ in chunk] if pool_empty else answerer.retrieve(chunk)
    texts, versions, grade_modes, fallbacks = [], [], [], []
    for q, exps in zip(chunk, used, strict=True):
        if exps:
            texts.append(answerer.render(prompts.inter_messages(q.question, exps)))
            versions.append(prompts.INTER_VERSION)
            grade_modes.append("inter")
            fallbacks.append(None)
        else:
            texts.append(answerer.render(prompts.actor_messages(q.question)))
            versions.append(prompts.ACTOR_VERSION)
            grade_modes.append("zero_shot")
            fallbacks.append(EMPTY_POOL if pool_empty else NOTHING_RELEVANT.format(gamma=answerer.retrieval.gamma))
    groups = generate_turns(answerer, texts, k, params, versions, grade_modes, [q.answer for q in chunk])
    return [
        Solution(q, "retrieval", [Sample([t]) for t in g], list(exps), fb)
        for q, g, exps, fb in zip(chunk, groups, used, fallbacks, strict=True)
    ]


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
    # Turn 2: one revision per first attempt, from that attempt's response text alone (`_Earlier` holds nothing
    # else): the same conversation continued (two-turn), or a fresh reflection prompt (single).
    second_prompts, second_golds = [], []
    for q, group in zip(chunk, first, strict=True):
        for turn in group:
            earlier = _Earlier(turn.response)
            if two_turn:
                messages = prompts.self_correct_messages(q.question, earlier)
            else:
                messages = prompts.intra_messages(q.question, [earlier])
            second_prompts.append(answerer.render(messages))
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
