"""Use diagnostics: whether a feedback-mode response uses its context, read from its text alone.

LANPO's collapse analysis (Section 3 and App. 8.1, Fig. 2(c)) says that with inter-sample feedback "the model often
ignores the provided examples and directly outputs answers", and App. 8.1 defines behaviour collapse as "the
model's tendency to ignore valuable, provided information—such as an experience or a solved example—and instead
generate a solution from scratch". Fig. 2(b)'s leakage is the other failure: a model that copies an answer it was
shown. These functions measure the textual symptoms of each, per response (docs/concepts.md, "Use diagnostics",
says what each can and cannot tell):

- `sections`: the response carries the headers its mode's prompt asks for, in order (`prompts.has_headers`, the
  format bonus's own check; correctness is not read). self_correct's reflection request asks for intra's headers.
- `echo`: the share of its context items' distinct word 5-gram shingles that the response also holds (`shingles`:
  lower-cased words, runs of letters or digits, everything else a separator; within one item, never across two;
  the fit marker `prompts.OMITTED` of a cut item is not the item's text and is removed first). A shingle the
  question also holds is left out on both sides, so that restating the problem is not counted as using the
  context. When the items hold no shingle (every item under 5 words) echo is 0, not undefined.
- `answer_only`: a boxed final answer (`rewards.extract_boxed`) with fewer than `ANSWER_ONLY_WORDS` words outside
  every `\\boxed{...}` and the mode's header markers (words as above).
- `answer_copied`: the response's final boxed answer is, as a string with whitespace removed, the final boxed
  answer of one of its context items (lanpo never shows a gold answer, so this is the copy of an earlier answer
  that intra can show, the leakage shape of Fig. 2(b) without the label).

Pure: text in, numbers out; no store, no model. Nothing here ever reaches a prompt (tests/test_diagnostics.py
checks that no prompt builder imports it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from lanpo import prompts
from lanpo.feedback_modes import required_headers
from lanpo.rewards import extract_boxed

SHINGLE_WORDS = 5  # words per shingle: long enough that common phrases ("the number of") rarely match by chance
# An answer-only reply: a boxed answer and fewer words than this around it. The paper gives no number (App. 8.1
# shows one case); lanpo's own, from text: "The answer is \boxed{72}." has 3 words, the common sign-off "Final
# Answer: The final answer is \boxed{72}. I hope it is correct." 11, and the tersest worked two-step solution,
# "48 / 2 = 24 clips in May. 48 + 24 = 72 clips in total. \boxed{72}", 12.
ANSWER_ONLY_WORDS = 12
DIAGNOSED_MODES = ("intra", "inter", "retrieval", "self_correct")  # modes whose prompt carries a context
DIAGNOSTICS = ("sections", "echo", "answer_only", "answer_copied")  # use/<diagnostic>/<mode>

_WORD = re.compile(r"[^\W_]+")
_MARKER = re.compile(re.escape(prompts.OMITTED).replace(re.escape("{n}"), r"\d+"))


def words(text: str) -> list[str]:
    """The lower-cased words of `text`: maximal runs of letters or digits (LaTeX, markdown, punctuation split)."""
    return _WORD.findall(text.lower())


def shingles(text: str, size: int = SHINGLE_WORDS) -> set[tuple[str, ...]]:
    """The distinct runs of `size` consecutive words of `text` (none when it has fewer words)."""
    found = words(_MARKER.sub(" ", text))
    return {tuple(found[i : i + size]) for i in range(len(found) - size + 1)}


def sections(response: str, mode: str) -> bool:
    """Whether `response` carries every header its mode's prompt asks for, in order (False for a mode without)."""
    headers = required_headers(mode)
    return bool(headers) and prompts.has_headers(response, headers)


def echo(response: str, items: Sequence[str], question: str = "") -> float:
    """|S(items) ∩ S(response)| / |S(items)|, shingles the question also holds left out; 0 when S(items) is empty."""
    asked = shingles(question)
    context = set().union(*(shingles(item) for item in items)) - asked
    if not context:
        return 0.0
    return len(context & shingles(response)) / len(context)


def _without_boxes(text: str) -> str:
    """`text` with every `\\boxed{...}` (braces balanced; an unclosed one to the end) removed."""
    out, i = [], 0
    while (start := text.find("\\boxed{", i)) != -1:
        out.append(text[i:start])
        depth, j = 0, start + len("\\boxed{")
        while j < len(text) and not (text[j] == "}" and depth == 0):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j + 1
    out.append(text[i:])
    return "".join(out)


def reasoning_words(response: str, mode: str) -> int:
    """Words of `response` outside its boxed answers and its mode's header markers."""
    lines = []
    for line in _without_boxes(response).splitlines():
        stripped = line.strip()
        for header in required_headers(mode):
            if stripped.lower().startswith(header.lower()):
                stripped = stripped[len(header) :]
                break
        lines.append(stripped)
    return len(words("\n".join(lines)))


def answer_only(response: str, mode: str) -> bool:
    """A boxed final answer with fewer than ANSWER_ONLY_WORDS words of reasoning around it."""
    return extract_boxed(response) is not None and reasoning_words(response, mode) < ANSWER_ONLY_WORDS


def _answer(text: str) -> str | None:
    boxed = extract_boxed(text)
    return None if boxed is None else re.sub(r"\s+", "", boxed)


def answer_copied(response: str, items: Sequence[str]) -> bool:
    """The response's final boxed answer equals (as a string, whitespace removed) one of its items' final answers."""
    answer = _answer(response)
    return answer is not None and any(_answer(item) == answer for item in items)


@dataclass(frozen=True)
class Use:
    """The diagnostics of one response (`DIAGNOSTICS`, in order)."""

    sections: bool
    echo: float
    answer_only: bool
    answer_copied: bool

    def values(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in DIAGNOSTICS}


def diagnose(response: str, mode: str, items: Sequence[str], question: str = "") -> Use:
    """Every diagnostic of one response made in `mode` with the context item texts `items` (as the prompt showed
    them) under `question`."""
    return Use(
        sections(response, mode),
        echo(response, items, question),
        answer_only(response, mode),
        answer_copied(response, items),
    )


class HasResponse(Protocol):
    @property
    def response(self) -> str: ...


class Shown(Protocol):
    """A rollout group as the diagnostics read it (lanpo.feedback.record.GroupRecord): its mode, its question, the
    texts of its context items as the prompt showed them, and its rollouts' responses."""

    @property
    def mode(self) -> str: ...
    @property
    def question(self) -> str: ...
    @property
    def context_texts(self) -> list[str]: ...
    @property
    def rollouts(self) -> Sequence[HasResponse]: ...


def use_metrics(groups: Sequence[Shown]) -> dict[str, float]:
    """`use/<diagnostic>/<mode>`: each diagnostic's mean over the mode's rollouts, for each mode of DIAGNOSED_MODES
    with rollouts in `groups` (none: no metric); and `use/answer_only/zero_shot`, the reference without a context."""
    out: dict[str, float] = {}
    for mode in DIAGNOSED_MODES:
        uses = [
            diagnose(r.response, mode, g.context_texts, g.question).values()
            for g in groups
            if g.mode == mode
            for r in g.rollouts
        ]
        for name in DIAGNOSTICS if uses else ():
            out[f"use/{name}/{mode}"] = sum(u[name] for u in uses) / len(uses)
    plain = [answer_only(r.response, "zero_shot") for g in groups if g.mode == "zero_shot" for r in g.rollouts]
    if plain:
        out["use/answer_only/zero_shot"] = sum(plain) / len(plain)
    return out
