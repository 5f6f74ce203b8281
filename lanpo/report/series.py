"""What a report is drawn from: runs with their metric series, grouped into lines (a run, or an arm over seeds).

Pure data and numpy: no session, no matplotlib. `band` is the one statistic the figures draw over seeds: the mean
at each step over the seeds that recorded it, with the min–max (or ±1 sample std) around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np

Band = Literal["minmax", "std"]
BAND_LABELS = {"minmax": "min–max over seeds", "std": "±1 std over seeds (sample std)"}


@dataclass(frozen=True)
class Series:
    """One metric of one run: values at steps, in step order (NaN where the run recorded a NaN, e.g. no update)."""

    steps: np.ndarray  # (S,) int64
    values: np.ndarray  # (S,) float64

    @classmethod
    def of(cls, steps: Sequence[int], values: Sequence[float | None]) -> Series:
        order = np.argsort(np.asarray(steps, dtype=np.int64), kind="stable")
        as_float = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        return cls(np.asarray(steps, dtype=np.int64)[order], as_float[order])

    def at(self, step: int) -> float | None:
        """The value at `step` (None when the run recorded none there)."""
        hits = np.nonzero(self.steps == step)[0]
        return float(self.values[hits[-1]]) if len(hits) else None

    def last(self) -> tuple[int, float] | None:
        """(step, value) of the last finite value."""
        finite = np.nonzero(np.isfinite(self.values))[0]
        return (int(self.steps[finite[-1]]), float(self.values[finite[-1]])) if len(finite) else None

    def has_data(self) -> bool:
        return bool(np.isfinite(self.values).any())


@dataclass(frozen=True)
class RunInfo:
    """A run as the report labels and groups it (read from `runs` and its config)."""

    id: int
    name: str
    kind: str
    status: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    experiment: str | None = None
    arm: str | None = None
    seed: int | None = None  # config.seed: what pairs the runs of two arms
    feedback_mode: str | None = None  # config.feedback.mode
    p_t: float | None = None  # config.feedback.p_t: the share of prompts that asks for feedback
    group_size: int | None = None  # config.rollout.n
    last_step: int | None = None  # last committed training step

    @property
    def asked_p_t(self) -> float | None:
        """The feedback share the run asked for: p_t, or 0 for plain GRPO (feedback.mode = none)."""
        return 0.0 if self.feedback_mode == "none" else self.p_t


@dataclass
class RunData:
    run: RunInfo
    metrics: dict[str, Series] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how something was read, e.g. validation recounted


@dataclass
class Line:
    """What one colour in every figure and one row of the table stands for: a run, or an arm over its seeds."""

    label: str
    runs: list[RunData]
    experiment: str | None = None
    arm: str | None = None

    @property
    def seeds(self) -> int:
        return len(self.runs)


@dataclass(frozen=True)
class Aggregate:
    """A line's curve: the mean over its runs at each step, and the band around it (equal to it for one run)."""

    steps: np.ndarray  # (S,)
    mean: np.ndarray  # (S,)
    low: np.ndarray  # (S,)
    high: np.ndarray  # (S,)
    count: np.ndarray  # (S,) runs with a finite value at the step


def band(series: Sequence[Series], kind: Band = "minmax") -> Aggregate:
    """Mean over runs at every step any of them recorded, with the min–max or ±1 std (ddof=1) band over runs."""
    steps = np.unique(np.concatenate([s.steps for s in series])) if series else np.zeros(0, np.int64)
    grid = np.full((len(series), len(steps)), np.nan)  # (R, S)
    for row, s in enumerate(series):
        grid[row, np.searchsorted(steps, s.steps)] = s.values
    finite = np.isfinite(grid)
    count = finite.sum(axis=0)
    total = np.where(finite, grid, 0.0).sum(axis=0)
    mean = np.divide(total, count, out=np.full(len(steps), np.nan), where=count > 0)
    if kind == "minmax":
        low = np.where(count > 0, np.where(finite, grid, np.inf).min(axis=0), np.nan)
        high = np.where(count > 0, np.where(finite, grid, -np.inf).max(axis=0), np.nan)
    else:
        squares = np.where(finite, (grid - mean) ** 2, 0.0).sum(axis=0)
        std = np.sqrt(np.divide(squares, count - 1, out=np.zeros(len(steps)), where=count > 1))
        low, high = mean - std, mean + std
    return Aggregate(steps, mean, low, high, count)


def derived(a: Series, b: Series, how: str) -> Series:
    """a / b or a + b on the steps both recorded (a division by 0 gives NaN, a gap in the curve)."""
    common, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    x, y = a.values[ia], b.values[ib]
    if how == "div":
        values = np.divide(x, y, out=np.full(len(common), np.nan), where=y != 0)
    elif how == "add":
        values = x + y
    else:
        raise ValueError(f"unknown operation {how!r}")
    return Series(common, values)
