"""Where a contrastive pair parts: reasoning steps and the first step that differs (pure text functions).

A response splits into steps by `lines` (its non-empty lines: what small models and most chain-of-thought
formats produce, one calculation per line) or `sentences` (lines further split after `.`, `!` or `?` followed by
whitespace, so decimals such as 3.5 stay whole). Two steps are the same after normalisation: case folded,
whitespace collapsed, list markers and trailing punctuation dropped.

The heuristic bifurcation is the first step of the incorrect response y- that differs from the step at the same
position of the correct one y+; the steps before it are the shared prefix. When y- is the shorter and all its
steps are shared, its last step is taken. Steps are numbered from 1, as the diagnosis prompt shows them.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LIST_MARKER = re.compile(r"^(?:[-*•]+|\d+[.)]|step\s+\d+\s*[:.)-]?)\s*", re.IGNORECASE)


def split_steps(text: str, how: str = "lines") -> list[str]:
    """The reasoning steps of a response, in order (`how`: lines | sentences); empty steps are dropped."""
    if how not in ("lines", "sentences"):
        raise ValueError(f"how must be lines or sentences, got {how!r}")
    lines = [line.strip() for line in text.splitlines()]
    if how == "sentences":
        lines = [part.strip() for line in lines for part in _SENTENCE_END.split(line)]
    return [line for line in lines if line]


def normalise_step(step: str) -> str:
    """A step as compared: case folded, list marker and trailing punctuation dropped, spaces collapsed."""
    text = _LIST_MARKER.sub("", step.strip())
    text = re.sub(r"\s+", " ", text).casefold()
    return text.rstrip(" .,;:!?")


def shared_prefix(positive: list[str], negative: list[str]) -> int:
    """How many leading steps the two step lists share after normalisation."""
    shared = 0
    for a, b in zip(positive, negative, strict=False):
        if normalise_step(a) != normalise_step(b):
            break
        shared += 1
    return shared


def first_difference(positive: list[str], negative: list[str]) -> tuple[int, int]:
    """(bifurcation step of the negative, 1-based; shared prefix length). A negative with no step gives (1, 0)."""
    shared = shared_prefix(positive, negative)
    return max(1, min(shared + 1, len(negative))), shared
