"""A simulated policy whose lessons' true effects are known by construction (`rollout.backend = "sim"`).

A language model at 135M cannot show whether the store's estimates of a lesson's usefulness are right: nobody
knows what its lessons are truly worth. This backend answers questions with a chance of success set by a table,
so every lesson's true effect is known, while everything around it is lanpo's own: the trainer loop, the draws,
the summariser's admission, capacity, the SQL that records uses and estimates lifts. It reads prompts as text, the
way a model does, and nothing of the store.

- **Solving.** A prompt whose text holds a known question (the longest that occurs in it; the trainer passes the
  store's problems) is answered correctly with probability

      p = clip(base(question) + sum of effect(tag) over the lesson tags in the prompt, 0.02, 0.98)

  where `base` is the question's difficulty, uniform in [`base_low`, `base_high`] by a hash of its text, and a
  lesson tag (`[lesson abcdefgh]`, written into every lesson the sim summarises) helps by `+effect` with chance
  `helps`, hurts by `-effect` with chance `hurts`, and does nothing otherwise, by a hash of the tag and the table's
  `seed`. A correct answer ends in `\\boxed{gold}`, a wrong one in a boxed number one off (or `\\boxed{unknown}`),
  so the real grader grades them. Earlier attempts (intra contexts) carry no tag and change nothing.
- **Summarising.** A prompt of the summary template (`lanpo.prompts.SUMMARY_SYSTEM`) gets a lesson under the three
  headers, of words of its own, with a fresh tag (a hash of the prompt, the seed and the sample): the admission
  checks pass it as they would a well-written lesson. A scaffolded call (the prompt ends in one of the headers)
  gets that section's body; the tag rides in the first.

Draws are seeded: a call with `SamplingParams.seed` returns the same completions for the same prompts. Every
completion's tokens are the tokenizer's encoding of its text plus EOS, so the trainer's loss runs on them as on any
rollout (the policy's gradients change nothing here: the table is the policy).
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from lanpo.config import check as _check
from lanpo.config import help_field
from lanpo.errors import InputError
from lanpo.prompts import SUMMARY_HEADERS, SUMMARY_SYSTEM
from lanpo.rollout import Completion, SamplingParams

TAG = re.compile(r"\[lesson ([a-z]{8})\]")
P_FLOOR, P_CEIL = 0.02, 0.98  # no question is certain either way: every group can have reward spread


@dataclass(frozen=True)
class SimTable:
    """`rollout.sim`: the simulated policy's table of difficulties and lesson effects (see the module docstring)."""

    seed: int = help_field(0, "the table's seed: which lessons help or hurt, and each question's difficulty")
    helps: float = help_field(0.2, "share of lessons that raise a problem's chance of success by `effect`")
    hurts: float = help_field(0.2, "share of lessons that lower it by `effect`")
    effect: float = help_field(0.3, "how much a helping (hurting) lesson adds to (takes from) the chance")
    base_low: float = help_field(0.2, "the lowest chance of success zero-shot (difficulty: uniform in low..high)")
    base_high: float = help_field(0.8, "the highest chance of success zero-shot")

    def __post_init__(self) -> None:
        for name in ("helps", "hurts", "effect", "base_low", "base_high"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, f"rollout.sim.{name} must be in [0, 1], got {value}")
        _check(
            self.helps + self.hurts <= 1.0, f"rollout.sim.helps + hurts must be <= 1, got {self.helps + self.hurts}"
        )
        _check(
            self.base_low <= self.base_high,
            f"rollout.sim.base_low ({self.base_low}) must be <= base_high ({self.base_high})",
        )

    def base(self, question: str) -> float:
        """The question's chance of success with no lesson."""
        return self.base_low + (self.base_high - self.base_low) * _unit("base", self.seed, question)

    def effect_of(self, tag: str) -> float:
        """What lesson `tag` adds to a problem's chance of success: +effect, -effect or 0."""
        u = _unit("effect", self.seed, tag)
        if u < self.helps:
            return self.effect
        return -self.effect if u < self.helps + self.hurts else 0.0

    def p_correct(self, question: str, tags: list[str]) -> float:
        """The chance of a correct answer to `question` with lessons `tags` in the prompt."""
        p = self.base(question) + sum(self.effect_of(t) for t in tags)
        return min(max(p, P_FLOOR), P_CEIL)


def tags_in(text: str) -> list[str]:
    """The lesson tags of `text`, in order (a lesson shown twice counts twice)."""
    return TAG.findall(text)


class SimBackend:
    """The simulated policy as a rollout backend: `problems` maps each question it may be asked to its gold answer."""

    def __init__(self, model: Any, tokenizer: Any, table: SimTable, problems: Mapping[str, str | None]) -> None:
        self.model = model  # the trained model: its adapter's hash rides on every completion, as hf's does
        self.tokenizer = tokenizer
        self.table = table
        self.problems = {q: a for q, a in problems.items() if q}
        self._by_length = sorted(self.problems, key=len, reverse=True)

    def served_adapter_sha256(self) -> str | None:
        if not hasattr(self.model, "peft_config"):
            return None
        from lanpo.models import adapter_sha256

        return adapter_sha256(self.model)

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        served = self.served_adapter_sha256()
        out = []
        for prompt in prompts:
            prompt_ids = tuple(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            texts = [self._reply(prompt, params.seed, i) for i in range(n)]
            out.append([self._completion(t, prompt_ids, params, served) for t in texts])
        return out

    def _reply(self, prompt: str, seed: int | None, sample: int) -> str:
        draw = (seed if seed is not None else random.getrandbits(64), sample)
        if SUMMARY_SYSTEM in prompt:
            return _lesson(prompt, draw, self.table.seed)
        question = next((q for q in self._by_length if q in prompt), None)
        if question is None:
            raise InputError(
                "the simulated policy was asked a question it has no gold answer for",
                hint="rollout.backend = sim answers only the store's problems it was given",
            )
        p = self.table.p_correct(question, tags_in(prompt))
        correct = _unit("answer", *draw, prompt) < p
        answer = self.problems[question]
        shown = answer if correct else _wrong(answer)
        return f"Working through the steps in order gives the result.\nThe answer is \\boxed{{{shown}}}."

    def _completion(
        self, text: str, prompt_ids: tuple[int, ...], params: SamplingParams, served: str | None
    ) -> Completion:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: params.max_new_tokens]
        eos = self.tokenizer.eos_token_id
        finished = len(ids) < params.max_new_tokens and eos is not None
        if finished:
            ids.append(eos)
        shown = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(
            shown, tuple(ids), prompt_ids, "stop" if finished else "length", served_adapter_sha256=served
        )


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) from a hash of `parts`."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:7], "big") / float(1 << 56)


def _wrong(answer: str | None) -> str:
    try:
        return str(Fraction((answer or "").replace(",", "").strip()) + 1)
    except (ValueError, ZeroDivisionError):
        return "unknown"


_BODIES = {
    "## Flow": (
        "Read each operation from left to right, keep a running total, and apply every sign to the term after it.",
        "Split the task into small steps, settle each intermediate value, then combine them in the stated order.",
    ),
    "## Principles": (
        "Addition and subtraction of whole terms can be regrouped; carry the sign with its term when regrouping.",
        "State what each step computes before computing it, so that a slip in one step is visible in the next.",
    ),
    "## Pitfalls": (
        "Dropping a minus sign halfway, or adding a term twice when the list of terms is long.",
        "Stopping one step early and reporting an intermediate total instead of the final one.",
    ),
}


def _lesson(prompt: str, draw: tuple[object, int], table_seed: int) -> str:
    """A lesson under the summary headers with a fresh tag; a scaffolded call gets only its section's body."""
    letters = string.ascii_lowercase
    digest = hashlib.sha256(f"lesson/{table_seed}/{draw}/{prompt}".encode()).digest()
    tag = "".join(letters[b % 26] for b in digest[:8])
    pick = digest[8] % 2
    last = prompt.rstrip().splitlines()[-1].strip() if prompt.strip() else ""
    if last in SUMMARY_HEADERS:  # scaffolded: the code wrote this header; the tag rides in the first section
        body = _BODIES[last][pick]
        return f"[lesson {tag}] {body}" if last == SUMMARY_HEADERS[0] else body
    flow, principles, pitfalls = (_BODIES[h][pick] for h in SUMMARY_HEADERS)
    return f"## Flow\n[lesson {tag}] {flow}\n## Principles\n{principles}\n## Pitfalls\n{pitfalls}"
