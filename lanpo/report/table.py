"""The final table in the paper's Table 1 shape: rows = methods (arms or runs), columns = datasets + Average.

A cell is held-out mean@k at each run's last validated step, then mean ± sample std (ddof=1) over the row's seeds;
the Average column is each run's unweighted mean over the datasets (as in the paper), then mean ± std over seeds.
The same at step 0 (before any update), and, for an experiment with a baseline arm, the paired difference: each
seed's value minus the baseline arm's value for the same seed, mean ± std over the pairs. Beside the final
cells, what they cost: each run's generated tokens, training minutes and prompt tokens up to its last validated step
(the `lanpo.report.cost` axes), mean over seeds (std and each seed's value in table.csv). Pure functions.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from lanpo.report.cost import PROMPT_AXIS, SECONDS_AXIS, TOKENS_AXIS, TRAINED_AXIS
from lanpo.report.figures import validation_keys
from lanpo.report.series import Line, RunData

AVERAGE = "Average"
GENERATED_TOKENS = "generated tokens"
TRAINING_MINUTES = "training minutes"
PROMPT_TOKENS = "prompt tokens"
TRAINED_TOKENS = "trained tokens"  # generated or replayed: what the update trained on (lanpo.report.cost)
# the final table's cost columns, after Average
COSTS = (GENERATED_TOKENS, TRAINING_MINUTES, PROMPT_TOKENS, TRAINED_TOKENS)


@dataclass(frozen=True)
class Stat:
    """Values over seeds (or over seed pairs) of one cell."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof=1); None for a single value."""
        if self.n < 2:
            return None
        return math.sqrt(sum((v - self.mean) ** 2 for v in self.values) / (self.n - 1))


@dataclass
class Row:
    label: str
    line: Line
    final: dict[str, Stat] = field(default_factory=dict)  # column -> stat
    start: dict[str, Stat] = field(default_factory=dict)
    final_steps: tuple[int, ...] = ()  # each run's last validated step
    cost: dict[str, Stat] = field(default_factory=dict)  # GENERATED_TOKENS / TRAINING_MINUTES up to that step
    diff: dict[str, Stat] = field(default_factory=dict)  # against `baseline`, paired by seed
    baseline: str | None = None


@dataclass
class ResultTable:
    datasets: list[str]
    ks: dict[str, int]  # dataset -> k of its mean@k
    rows: list[Row]

    @property
    def columns(self) -> list[str]:
        return [*self.datasets, AVERAGE] if self.datasets else []

    def to_markdown(self, which: str) -> str:
        """`final`, `start` or `diff` as a markdown table (percent, one decimal; `-` for an empty cell)."""
        rows = [r for r in self.rows if getattr(r, which)]
        if not rows:
            return ""
        same_k = len(set(self.ks.values())) == 1
        heads = [d if same_k else f"{d} (mean@{self.ks[d]})" for d in self.datasets]
        costs = list(COSTS) if which == "final" else []  # `-` where a run did not record its cost
        count = "pairs" if which == "diff" else "seeds"
        lines = [f"| method | {count} | " + " | ".join([*heads, AVERAGE, *costs]) + " |"]
        lines.append("| --- | ---: | " + " | ".join(["---:"] * (len(self.columns) + len(costs))) + " |")
        for r in rows:
            cells: dict[str, Stat] = getattr(r, which)
            n = max((s.n for s in cells.values()), default=0)
            label = f"{r.label} − {r.baseline}" if which == "diff" else r.label
            row = [_cell(cells.get(c), which == "diff") for c in self.columns]
            row += [_cost_cell(c, r.cost.get(c), n) for c in costs]
            lines.append(f"| {label} | {n} | " + " | ".join(row) + " |")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """One line per (table, row, column): means and stds as fractions, the seeds' values joined by `;`."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(
            ["table", "row", "experiment", "arm", "baseline", "column", "k", "n", "mean", "std", "values", "steps"]
        )
        for which in ("final", "start", "diff"):
            for r in self.rows:
                cells: dict[str, Stat] = getattr(r, which)
                if which == "final":
                    cells = {**cells, **r.cost}
                for column in [*self.columns, *(COSTS if which == "final" else ())]:
                    s = cells.get(column)
                    if s is None:
                        continue
                    writer.writerow(
                        [
                            which,
                            r.label,
                            r.line.experiment or "",
                            r.line.arm or "",
                            r.baseline if which == "diff" else "",
                            column,
                            self.ks.get(column, ""),
                            s.n,
                            f"{s.mean:.6f}",
                            "" if s.std is None else f"{s.std:.6f}",
                            ";".join(f"{v:.6f}" for v in s.values),
                            ";".join(str(x) for x in r.final_steps) if which == "final" else "",
                        ]
                    )
        return buffer.getvalue()


def _cell(stat: Stat | None, signed: bool) -> str:
    if stat is None:
        return "-"
    text = f"{100 * stat.mean:+.1f}" if signed else f"{100 * stat.mean:.1f}"
    return text if stat.std is None else f"{text} ± {100 * stat.std:.1f}"


def _cost_cell(column: str, stat: Stat | None, seeds: int) -> str:
    """The mean over seeds: tokens as 812, 45.3k, 1.25M; minutes with one decimal; `(n of N)` when seeds lack it."""
    if stat is None:
        return "-"
    if column in (GENERATED_TOKENS, PROMPT_TOKENS, TRAINED_TOKENS):
        value = stat.mean
        text = f"{value / 1e9:.2f}G" if value >= 1e9 else f"{value / 1e6:.2f}M" if value >= 1e6 else ""
        text = text or (f"{value / 1e3:.1f}k" if value >= 1e4 else f"{value:.0f}")
    else:
        text = f"{stat.mean:.1f}"
    return text if stat.n >= seeds else f"{text} ({stat.n} of {seeds})"


@dataclass(frozen=True)
class RunCells:
    """One run's mean@k per dataset plus Average (only over a complete row): at its last validated step, at 0."""

    final: dict[str, float]
    start: dict[str, float]
    last_step: int | None
    cost: dict[str, float] = field(default_factory=dict)  # GENERATED_TOKENS / TRAINING_MINUTES up to last_step


def run_cells(run: RunData, ks: dict[str, int]) -> RunCells:
    """The run's cells: each dataset's last finite mean@k, and its value at step 0 when validated there."""
    final: dict[str, float] = {}
    start: dict[str, float] = {}
    steps = []
    for dataset, k in ks.items():
        series = run.metrics.get(f"val/{dataset}/mean@{k}")
        last = series.last() if series is not None else None
        if series is None or last is None:
            continue
        steps.append(last[0])
        final[dataset] = last[1]
        first = series.at(0)
        if first is not None and math.isfinite(first):
            start[dataset] = first
    for cells in (final, start):
        if ks and len(cells) == len(ks):
            cells[AVERAGE] = sum(cells.values()) / len(cells)
    last_step = max(steps) if steps else None
    return RunCells(final, start, last_step, run_cost(run, last_step))


def run_cost(run: RunData, step: int | None) -> dict[str, float]:
    """Generated tokens, training minutes and prompt tokens up to and including `step` (a cost not recorded there:
    left out)."""
    out: dict[str, float] = {}
    if step is None:
        return out
    axes = (
        (GENERATED_TOKENS, TOKENS_AXIS, 1.0),
        (TRAINING_MINUTES, SECONDS_AXIS, 1 / 60),
        (PROMPT_TOKENS, PROMPT_AXIS, 1.0),
        (TRAINED_TOKENS, TRAINED_AXIS, 1.0),
    )
    for column, axis, scale in axes:
        cost = axis.of(run)
        value = cost.at(step) if cost is not None else None
        if value is not None and math.isfinite(value):
            out[column] = value * scale
    return out


def result_table(lines: list[Line], baselines: dict[str | None, Line]) -> ResultTable:
    """The table of `lines`; `baselines` maps an experiment to its baseline arm (paired differences)."""
    ks = validation_keys([r for line in lines for r in line.runs])
    per_run = {id(r): run_cells(r, ks) for line in lines for r in line.runs}
    table = ResultTable(list(ks), ks, [])
    for line in lines:
        row = Row(line.label, line)
        cells = [per_run[id(r)] for r in line.runs]
        for column in table.columns:
            for target, of_run in ((row.final, [c.final for c in cells]), (row.start, [c.start for c in cells])):
                values = tuple(found[column] for found in of_run if column in found)
                if values:
                    target[column] = Stat(values)
        row.final_steps = tuple(c.last_step for c in cells if c.last_step is not None)
        for column in COSTS:
            values = tuple(c.cost[column] for c in cells if column in c.cost)
            if values:
                row.cost[column] = Stat(values)
        base = baselines.get(line.experiment)
        if base is not None and base is not line:
            row.baseline = base.label
            row.diff = _paired(line, base, table.columns, per_run)
        table.rows.append(row)
    return table


def _paired(line: Line, base: Line, columns: list[str], per_run: dict[int, RunCells]) -> dict[str, Stat]:
    """Per column: this line's final value minus the baseline's, for each seed both have exactly once."""
    mine, theirs = _by_seed(line, per_run), _by_seed(base, per_run)
    out = {}
    for column in columns:
        diffs = tuple(
            mine[s][column] - theirs[s][column]
            for s in sorted(set(mine) & set(theirs))
            if column in mine[s] and column in theirs[s]
        )
        if diffs:
            out[column] = Stat(diffs)
    return out


def _by_seed(line: Line, per_run: dict[int, RunCells]) -> dict[int, dict[str, float]]:
    """seed -> final cells, for the seeds that one run of the line has (a repeated seed cannot be paired)."""
    seeds = [r.run.seed for r in line.runs]
    return {
        r.run.seed: per_run[id(r)].final for r in line.runs if r.run.seed is not None and seeds.count(r.run.seed) == 1
    }
