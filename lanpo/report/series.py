"""What a report is drawn from: runs with their metric series, grouped into lines (a run, or an arm over seeds).

Pure data and numpy: no session, no matplotlib. `band` is the one statistic the figures draw over seeds: the mean
at each step over the seeds that recorded it, with the min–max (or ±1 sample std) around it. `band_on_grid` is the
same against a cost axis (tokens, seconds), where no two seeds share an x: each seed interpolated onto one grid.
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
    # metric -> its standard error per step, where the store holds what it is a mean of (validation's mean@k: over
    # the held-out problems, from the stored `val` attempts)
    errors: dict[str, Series] = field(default_factory=dict)


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
    """A line's curve: the mean over its runs at each x, and the band around it (equal to it for one run)."""

    x: np.ndarray  # (S,) steps, or a cost axis' values (cumulative tokens, seconds)
    mean: np.ndarray  # (S,)
    low: np.ndarray  # (S,)
    high: np.ndarray  # (S,)
    count: np.ndarray  # (S,) runs with a finite value at x


def band(series: Sequence[Series], kind: Band = "minmax") -> Aggregate:
    """Mean over runs at every step any of them recorded, with the min–max or ±1 std (ddof=1) band over runs."""
    steps = np.unique(np.concatenate([s.steps for s in series])) if series else np.zeros(0, np.int64)
    grid = np.full((len(series), len(steps)), np.nan)  # (R, S)
    for row, s in enumerate(series):
        grid[row, np.searchsorted(steps, s.steps)] = s.values
    return _over_runs(steps, grid, kind)


def band_on_grid(curves: Sequence[tuple[np.ndarray, np.ndarray]], kind: Band = "minmax") -> Aggregate:
    """Mean and band over runs whose points (x, y) lie at different x, e.g. accuracy against tokens.

    Seeds validate at the same steps but reach them at different token counts and seconds, so no two share an x.
    Each run's curve is interpolated linearly between its own points (the segment the plot draws) onto the union
    of every run's x, kept where every run covers it: from the largest first x to the smallest last x. So the
    mean is over the same runs everywhere (past the shortest run's end it would jump by that run's level, not by
    training) and nothing is extrapolated; every run's own measured x inside that range is a grid point.
    """
    kept = [(x, y) for x, y in curves if len(x)]
    if not kept:
        return _over_runs(np.zeros(0), np.zeros((0, 0)), kind)
    start, end = max(float(x.min()) for x, _ in kept), min(float(x.max()) for x, _ in kept)
    grid_x = np.unique(np.concatenate([x for x, _ in kept]))
    grid_x = grid_x[(grid_x >= start) & (grid_x <= end)]  # (S,)
    grid = np.stack([np.interp(grid_x, x, y) for x, y in kept]) if len(grid_x) else np.zeros((len(kept), 0))
    return _over_runs(grid_x, grid, kind)


def _over_runs(x: np.ndarray, grid: np.ndarray, kind: Band) -> Aggregate:
    """Mean and band over the rows of `grid` (R, S), column by column, ignoring NaN."""
    finite = np.isfinite(grid)
    count = finite.sum(axis=0)
    total = np.where(finite, grid, 0.0).sum(axis=0)
    mean = np.divide(total, count, out=np.full(len(x), np.nan), where=count > 0)
    if kind == "minmax":
        low = np.where(count > 0, np.where(finite, grid, np.inf).min(axis=0, initial=np.inf), np.nan)
        high = np.where(count > 0, np.where(finite, grid, -np.inf).max(axis=0, initial=-np.inf), np.nan)
    else:
        squares = np.where(finite, (grid - mean) ** 2, 0.0).sum(axis=0)
        std = np.sqrt(np.divide(squares, count - 1, out=np.zeros(len(x)), where=count > 1))
        low, high = mean - std, mean + std
    return Aggregate(x, mean, low, high, count)


def derived(a: Series, b: Series, how: str) -> Series:
    """a / b, a * b or a + b on the steps both recorded (a division by 0 gives NaN, a gap in the curve)."""
    common, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    x, y = a.values[ia], b.values[ib]
    if how == "div":
        values = np.divide(x, y, out=np.full(len(common), np.nan), where=y != 0)
    elif how == "mul":
        values = x * y
    elif how == "add":
        values = x + y
    else:
        raise ValueError(f"unknown operation {how!r}")
    return Series(common, values)


def total(run: RunData, names: Sequence[str]) -> Series | None:
    """The sum of the count metrics `names` on every step any of them has (a count not recorded there is 0)."""
    found = [run.metrics[n] for n in names if n in run.metrics]
    if not found:
        return None
    steps = np.unique(np.concatenate([s.steps for s in found]))
    values = np.zeros(len(steps))
    for s in found:
        values[np.searchsorted(steps, s.steps)] += np.nan_to_num(s.values)
    return Series(steps, values)
