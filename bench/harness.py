"""The benches' one timing loop: rows taken in turns, round by round, warm-up rounds left out, medians of the rest.

Every bench in bench/ times a reference beside lanpo (or variants beside each other) in one process. Timed one
after the other, whatever else runs on the cores lands on one row only; taken in turns, with the order rotating
every round so that no row always goes first, it lands on all of them. The first `warmup` rounds (allocators,
kernels, caches, query plans) are not counted, unless there are no more rounds than that.

    rounds = Rounds(("generate", "lanpo loop"), args.rounds)
    for round_, order in rounds:
        for row in order:
            out, seconds = rounds.time(round_, row, lambda: backends[row].generate(prompts, n, params))
    for row, seconds, speedup in rounds.against("generate"):
        print(f"| {row} | {seconds:.1f} | {speedup:.2f}x |")

A bench whose rows time phases of their own records them with `rounds.add(round_, key, seconds)`, any hashable key.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

Row = TypeVar("Row")
T = TypeVar("T")

# The reasoning-gym tasks the inference and serving benches ask about, and the lessons their pools hold.
TASKS = ["basic_arithmetic", "chain_sum", "gsm_symbolic", "simple_equations"]
LESSONS = [
    "Restate what is asked, list the given numbers, then combine them step by step.",
    "Work left to right, keep a running total and check each partial sum.",
    "Keep the sign attached to each number when subtracting in a long chain.",
    "Move the constant term first, then divide both sides by the coefficient.",
    "Translate the story into one equation, solve it, and re-read the question.",
    "Multiplication binds tighter than addition: evaluate products first.",
]


def rotated(rows: Sequence[Row], round_: int) -> list[Row]:
    """`rows` rotated left by `round_`: over len(rows) rounds each row goes first once."""
    shift = round_ % len(rows)
    return [*rows[shift:], *rows[:shift]]


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn's result and its wall seconds."""
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


class Rounds(Generic[Row]):
    """`rounds` interleaved rounds over `rows`, and the seconds recorded in the counted ones.

    `rotate`: the order turns every round (else every round runs `rows` as given). `warmup`: rounds not counted;
    when `rounds <= warmup` every round counts, so that one round still gives a figure.
    """

    def __init__(self, rows: Sequence[Row], rounds: int, warmup: int = 1, rotate: bool = True) -> None:
        if rounds < 1 or not rows:
            raise ValueError(f"need at least one round and one row, got {rounds} round(s) of {len(rows)} row(s)")
        self.rows = tuple(rows)
        self.rounds = rounds
        self.warmup = warmup if rounds > warmup else 0
        self.rotate = rotate
        self.seconds: dict[Hashable, list[float]] = {}

    def __iter__(self) -> Iterator[tuple[int, list[Row]]]:
        """(round index from 0, the rows in this round's order)."""
        for round_ in range(self.rounds):
            yield round_, rotated(self.rows, round_) if self.rotate else list(self.rows)

    def counted(self, round_: int) -> bool:
        return round_ >= self.warmup

    @property
    def measured(self) -> int:
        """How many rounds the medians are over."""
        return self.rounds - self.warmup

    def add(self, round_: int, key: Hashable, seconds: float) -> None:
        """Record `seconds` under `key`, if `round_` counts."""
        if self.counted(round_):
            self.seconds.setdefault(key, []).append(seconds)

    def time(self, round_: int, key: Hashable, fn: Callable[[], T]) -> tuple[T, float]:
        """Run fn, record its wall seconds under `key` (if `round_` counts), return its result and the seconds."""
        out, seconds = timed(fn)
        self.add(round_, key, seconds)
        return out, seconds

    def last(self, key: Hashable) -> float:
        return self.seconds[key][-1]

    def median(self, key: Hashable) -> float:
        return statistics.median(self.seconds[key])

    def against(
        self, reference: Hashable, keys: Iterable[Hashable] | None = None
    ) -> Iterator[tuple[Hashable, float, float]]:
        """Per key (the rows, in their given order, by default): its median seconds and the reference's median over
        it, the speed-up (above 1: faster than the reference)."""
        base = self.median(reference)
        for key in self.rows if keys is None else keys:
            seconds = self.median(key)
            yield key, seconds, base / seconds
