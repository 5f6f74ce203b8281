"""A scripted policy for MEL's loop tests: tiny random models never box an answer, so no group would be mixed.

The script answers every prompt kind the trainer sends (rollouts, diagnoses, replays, summaries) by what the prompt
is, deterministically; everything else -- pairs, parsing, grading, the update, the store -- is the real code.
Problems are the toy ones (`What is i + (i+1)?`): rollout j is correct when j is even, and wrong from its second
line on when j is odd; a lesson's replays all succeed on even problems and all fail on odd ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from lanpo.rollout import Completion, SamplingParams
from lanpo.train import state
from lanpo.train.producer import served_policy
from lanpo.train.producer.served_policy import ServedPolicy
from tests.train.conftest import toy_problems  # noqa: F401  (the toy dataset fixture)

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def solution(a: int, b: int, right: bool) -> str:
    total = a + b if right else a + b + 1
    return f"We add {a} and {b}.\n{a} + {b} = {total}\nSo the answer is \\boxed{{{total}}}"


DIAGNOSIS = (
    "## Bifurcation\nStep 2\n## Mistake\nAttempt B wrote {a} + {b} = {wrong}; attempt A wrote {right}.\n"
    "## Principle\nAdding two numbers needs the ones digits summed first.\n"
    "## Heuristic\nCheck a sum by subtracting one term from it."
)


class MelScript:
    """A deterministic stand-in for the policy's generations; `prompts` keeps every prompt it was sent, by kind."""

    def __init__(self, tokenizer: Any, served: Callable[[], str | None] = lambda: None) -> None:
        self.tokenizer = tokenizer
        self.served = served  # the adapter hash its completions carry: the live policy's, as the real backend's
        self.prompts: dict[str, list[str]] = {"rollout": [], "diagnosis": [], "replay": [], "summary": []}
        self.asked_logprobs: dict[str, set[bool]] = {kind: set() for kind in self.prompts}  # params.logprobs, by kind

    def _kind(self, prompt: str) -> str:
        if "Attempt A is correct" in prompt:
            return "diagnosis"
        if "A lesson from earlier work" in prompt:
            return "replay"
        if "Distil this into a lesson" in prompt:
            return "summary"
        return "rollout"

    def _text(self, kind: str, prompt: str, j: int) -> str:
        a, b = (int(x) for x in QUESTION.search(prompt).groups())  # type: ignore[union-attr]
        if kind == "diagnosis":
            return DIAGNOSIS.format(a=a, b=b, wrong=a + b + 1, right=a + b)
        if kind == "replay":
            return solution(a, b, right=a % 2 == 0)
        if kind == "summary":
            return "## Flow\nAdd the two terms.\n## Principles\nCarry tens.\n## Pitfalls\nOff by one."
        return solution(a, b, right=j % 2 == 0)

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        out = []
        for prompt in prompts:
            kind = self._kind(prompt)
            self.prompts[kind].append(prompt)
            self.asked_logprobs[kind].add(params.logprobs)
            ids = tuple(self.tokenizer.encode(prompt, add_special_tokens=False))
            group, served = [], self.served()
            for j in range(n):
                text = self._text(kind, prompt, j)
                tokens = (*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id)
                group.append(Completion(text, tokens, ids, "stop", served_adapter_sha256=served))
            out.append(group)
        return out


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[MelScript]:
    """Every backend the trainer makes is a MelScript (the list holds them, in order); the policy's sits under the
    run's real `ServedPolicy`, so its completions carry the live adapter's hash as the hf backend's would."""
    made: list[MelScript] = []
    real_open_served_policy = state.open_served_policy

    def open_served_policy(cfg: Any, model: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> ServedPolicy:
        engine = real_open_served_policy(cfg, model, tokenizer, *args, **kwargs)
        made.append(MelScript(tokenizer, served=engine.backend.served_adapter_sha256))
        engine.backend = made[-1]
        return engine

    def make_backend(name: str, model: Any, tokenizer: Any, **kwargs: Any) -> MelScript:
        made.append(MelScript(tokenizer))
        return made[-1]

    monkeypatch.setattr(state, "open_served_policy", open_served_policy)
    monkeypatch.setattr(served_policy, "make_backend", make_backend)  # the summariser's (build_summarizer)
    return made
