"""Contrastive pairs (y+, y-) from one step's GRPO groups: pure functions of the verifier's grades.

A group qualifies when it holds both a correct and an incorrect rollout (Y+ and Y- both non-empty): exactly the
groups whose rewards have spread, i.e. the ones that carry GRPO gradient. Within a group, rollouts with the same
text (after stripping) count once. Pairs are taken diagonal first: (y+_0, y-_0), (y+_1, y-_1), ..., then
(y+_0, y-_1), ..., so the first min(|Y+|, |Y-|) pairs share no rollout, and at most `per_problem` are kept per
problem (a problem drawn twice in one step shares the cap). A step-wide cap takes problems round-robin, so one
problem with many pairs does not fill it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    """A contrastive pair: rollout indices within group `group` of the step (y+ correct, y- not)."""

    group: int
    positive: int
    negative: int


def is_mixed(correct: Sequence[bool]) -> bool:
    """Whether a group's grades hold both a correct and an incorrect rollout."""
    return any(correct) and not all(correct)


def _distinct(indices: list[int], texts: Sequence[str]) -> list[int]:
    seen: set[str] = set()
    out = []
    for i in indices:
        key = texts[i].strip()
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


def group_pairs(correct: Sequence[bool], texts: Sequence[str]) -> list[tuple[int, int]]:
    """Every (positive, negative) index pair of one group with distinct texts, diagonal first."""
    positives = _distinct([i for i, c in enumerate(correct) if c], texts)
    negatives = _distinct([i for i, c in enumerate(correct) if not c], texts)
    if not positives or not negatives:
        return []
    width = len(negatives)
    ordered = sorted(
        ((a, b) for a in range(len(positives)) for b in range(len(negatives))),
        key=lambda ab: ((ab[1] - ab[0]) % width, ab[0]),
    )
    return [(positives[a], negatives[b]) for a, b in ordered]


def contrastive_pairs(
    problem_ids: Sequence[int],
    correct: Sequence[Sequence[bool]],
    texts: Sequence[Sequence[str]],
    per_problem: int,
    total: int = 0,
) -> list[Pair]:
    """The step's pairs: per group (G,) its grades and texts (n each); at most `per_problem` per problem and
    `total` overall (0: no limit), problems round-robin. Sorted by group, then by the diagonal order."""
    queues: dict[int, list[Pair]] = {}  # problem id -> its pairs, in group then diagonal order
    for g, (pid, grades, group_texts) in enumerate(zip(problem_ids, correct, texts, strict=True)):
        queue = queues.setdefault(pid, [])
        for positive, negative in group_pairs(grades, group_texts):
            if len(queue) >= per_problem:
                break
            queue.append(Pair(g, positive, negative))
    order = {pair: i for i, pair in enumerate(p for queue in queues.values() for p in queue)}
    pending = [list(queue) for queue in queues.values() if queue]
    chosen: list[Pair] = []
    while any(pending) and (total == 0 or len(chosen) < total):
        for queue in pending:
            if queue and (total == 0 or len(chosen) < total):
                chosen.append(queue.pop(0))
    return sorted(chosen, key=lambda p: (p.group, order[p]))
