"""Each line's held-out accuracy at one matched budget of generated tokens: the smallest line's final budget.

The budget axis is `lanpo.report.cost.TOKENS_AXIS`: every generated token (rollouts, summaries, MEL) summed over
the steps. A run's final budget is that sum at its last validation (every dataset validated, its cost known); a
line's (an arm over seeds) is the smallest of its seeds', so that every seed reaches it; the matched budget B is
the smallest line's (a line not trained yet, at 0, sets none). Each run's accuracy at B is read off the straight
line between the two consecutive validations that bracket it, x_i <= B <= x_j (B at a validation: that one alone):

    w = (B - x_i) / (x_j - x_i),    acc(B) = (1 - w) a_i + w a_j,
    SE(B) = sqrt((1 - w)^2 a_i (1 - a_i) / n_i + w^2 a_j (1 - a_j) / n_j)

with a the validation's mean@k and n its samples (`val/<dataset>/samples`: problems x k). That is the binomial SE
of each point, the samples taken as independent trials (the k samples of one problem are not, so where they agree
more than chance it understates the SE), combined as a weighted sum of two independent evaluations. A line over
seeds: the mean over its seeds, SE sqrt(sum SE_s^2) / S. The Average column: the mean over datasets, SE
sqrt(sum SE_d^2) / D (as `val_average`).
A run whose validations never reach B, or start above it, gives no value (nothing is extrapolated), and says which;
a run recorded before the samples count has it from its stored `val` attempts (`lanpo.report.read`), and
without either has a value and no SE. Pure functions and one figure.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lanpo.report.cost import TOKENS_AXIS
from lanpo.report.figures import validation_keys
from lanpo.report.series import Line, RunData

AVERAGE = "Average"
FIGURE = "matched_budget.png"
CSV = "matched_budget.csv"


def is_read(name: str) -> bool:
    """Whether the matched-budget table reads metric `name` (each validation's samples, its n)."""
    return name.startswith("val/") and name.endswith("/samples")


@dataclass(frozen=True)
class AtBudget:
    """One run's accuracy at the budget, or why it has none."""

    value: float | None
    se: float | None = None
    steps: tuple[int, int] | None = None  # the bracketing validations' steps (the same twice: B is a validation)
    why: str = ""  # when value is None: "never reaches" | "starts above" | "no cost"


def binomial_se(accuracy: float, samples: float) -> float:
    """sqrt(a (1 - a) / n), the binomial SE of a share a over n samples (NaN when n is unknown)."""
    return math.sqrt(accuracy * (1.0 - accuracy) / samples) if samples > 0 else math.nan


def at_budget(
    costs: Sequence[float], accuracies: Sequence[float], samples: Sequence[float], steps: Sequence[int], budget: float
) -> AtBudget:
    """The accuracy at `budget` between the two consecutive validations that bracket it, with its SE (module
    docstring); `costs` ascending, `samples` NaN where not recorded."""
    if not len(costs):
        return AtBudget(None, why="no cost")
    if budget > costs[-1]:
        return AtBudget(None, why="never reaches")
    if budget < costs[0]:
        return AtBudget(None, why="starts above")
    i = max(k for k in range(len(costs)) if costs[k] <= budget)
    if costs[i] == budget:
        se = binomial_se(accuracies[i], samples[i])
        return AtBudget(accuracies[i], None if math.isnan(se) else se, (steps[i], steps[i]))
    j = i + 1
    w = (budget - costs[i]) / (costs[j] - costs[i])
    value = (1 - w) * accuracies[i] + w * accuracies[j]
    var = (1 - w) ** 2 * binomial_se(accuracies[i], samples[i]) ** 2
    var += w**2 * binomial_se(accuracies[j], samples[j]) ** 2
    return AtBudget(value, None if math.isnan(var) else math.sqrt(var), (steps[i], steps[j]))


def _points(run: RunData, dataset: str, k: int) -> tuple[list[float], list[float], list[float], list[int]]:
    """(cumulative generated tokens, mean@k, samples, step) at each validation of `dataset` with a known cost."""
    series, cost = run.metrics.get(f"val/{dataset}/mean@{k}"), TOKENS_AXIS.of(run)
    if series is None or cost is None:
        return [], [], [], []
    counted = run.metrics.get(f"val/{dataset}/samples")
    out: tuple[list[float], list[float], list[float], list[int]] = ([], [], [], [])
    for step, value in zip(series.steps.tolist(), series.values.tolist(), strict=True):
        x = cost.at(step)
        if x is None or not math.isfinite(x) or not math.isfinite(value):
            continue
        n = counted.at(step) if counted is not None else None
        for column, item in zip(out, (x, value, math.nan if n is None else n, step), strict=True):
            column.append(item)  # type: ignore[attr-defined]
    return out


def final_budget(run: RunData, ks: dict[str, int]) -> float | None:
    """The run's generated tokens at its last validation of every dataset with a known cost (None: none)."""
    ends = [_points(run, d, k)[0] for d, k in ks.items()]
    return min(e[-1] for e in ends) if ends and all(ends) else None


@dataclass
class MatchedRow:
    label: str
    final_budget: float | None  # the smallest of its seeds' final budgets
    per_run: list[dict[str, AtBudget]] = field(default_factory=list)  # per seed, column -> its value at B
    runs: list[str] = field(default_factory=list)  # the seeds' run names, as per_run
    rollouts_only: bool = False  # a seed priced some step from its rollouts alone (an older run): understated

    def cell(self, column: str) -> tuple[float, float | None, int] | None:
        """(mean over the seeds that have a value, its SE or None, how many seeds) or None: no seed has one."""
        found = [r[column] for r in self.per_run if column in r and r[column].value is not None]
        if not found:
            return None
        mean = sum(f.value for f in found if f.value is not None) / len(found)
        errors = [f.se for f in found]
        se = None if any(e is None for e in errors) else math.sqrt(sum(e * e for e in errors if e)) / len(found)
        return mean, se, len(found)

    def why(self, column: str) -> str:
        """Why seeds have no value at B in `column` (empty when every seed has one)."""
        return ", ".join(sorted({r[column].why for r in self.per_run if column in r and r[column].value is None}))


@dataclass
class MatchedTable:
    budget: float | None  # None: no line recorded its generated tokens
    columns: list[str]
    rows: list[MatchedRow]

    def to_markdown(self) -> str:
        """One row per line: its final budget, then mean@k at the budget ± SE per column, in percent."""
        if self.budget is None or not self.rows:
            return ""
        lines = ["| method | seeds at B | final budget | " + " | ".join(self.columns) + " |"]
        lines.append("| --- | ---: | ---: | " + " | ".join(["---:"] * len(self.columns)) + " |")
        for row in self.rows:
            cells = []
            for column in self.columns:
                got = row.cell(column)
                if got is None:
                    cells.append(f"- ({row.why(column) or 'not recorded'})")
                    continue
                mean, se, _ = got
                cells.append(f"{100 * mean:.1f}" + ("" if se is None else f" ± {100 * se:.1f}"))
            seeds = max((c[2] for c in (row.cell(x) for x in self.columns) if c is not None), default=0)
            budget = "-" if row.final_budget is None else f"{row.final_budget:,.0f}"
            label = row.label + (" †" if row.rollouts_only else "")
            lines.append(f"| {label} | {seeds} of {len(row.per_run)} | {budget} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """One line per (row, column, seed): the value at the budget, its SE, the bracketing steps, or why none."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["row", "column", "run", "budget", "value", "se", "from_step", "to_step", "why"])
        for row in self.rows:
            for run, cells in zip(row.runs, row.per_run, strict=True):
                for column, at in cells.items():
                    writer.writerow(
                        [
                            row.label,
                            column,
                            run,
                            f"{self.budget:.0f}" if self.budget is not None else "",
                            "" if at.value is None else f"{at.value:.6f}",
                            "" if at.se is None else f"{at.se:.6f}",
                            *(at.steps if at.steps else ("", "")),
                            at.why,
                        ]
                    )
        return buffer.getvalue()


def matched_table(lines: Sequence[Line], budget: float | None = None) -> MatchedTable:
    """Each line at `budget` generated tokens (default: the smallest line's final budget)."""
    runs = [r for line in lines for r in line.runs]
    ks = validation_keys(runs)
    columns = [*ks, AVERAGE] if len(ks) > 1 else list(ks)
    rows = []
    for line in lines:
        finals = [final_budget(r, ks) for r in line.runs]
        known = [f for f in finals if f is not None]
        rows.append(MatchedRow(line.label, min(known) if known else None))
        rows[-1].rollouts_only = any(TOKENS_AXIS.per_step(r).rollouts_only for r in line.runs)
    if budget is None:
        ends = [row.final_budget for row in rows if row.final_budget]  # a line not trained yet (0) sets none
        budget = min(ends) if ends else None
    if budget is None or not ks:
        return MatchedTable(None, columns, rows)
    for row, line in zip(rows, lines, strict=True):
        for run in line.runs:
            cells = {d: at_budget(*_points(run, d, k), budget) for d, k in ks.items()}
            if len(ks) > 1:
                cells[AVERAGE] = _average(list(cells.values()))
            row.per_run.append(cells)
            row.runs.append(run.run.name)
    return MatchedTable(budget, columns, rows)


def _average(cells: list[AtBudget]) -> AtBudget:
    """The mean over datasets at the budget, SE sqrt(sum SE_d^2) / D; none when a dataset has none."""
    missing = [c for c in cells if c.value is None]
    if missing:
        return AtBudget(None, why=missing[0].why)
    errors = [c.se for c in cells]
    se = None if any(e is None for e in errors) else math.sqrt(sum(e * e for e in errors if e)) / len(cells)
    return AtBudget(sum(c.value for c in cells if c.value is not None) / len(cells), se)


def drawable(table: MatchedTable) -> bool:
    """Whether `draw` has a bar to draw: some line has a value in the last column."""
    return table.budget is not None and bool(table.columns) and any(r.cell(table.columns[-1]) for r in table.rows)


def draw(table: MatchedTable) -> object | None:
    """A bar per line of the last column (Average, or the one dataset) at the budget, ±1 SE; None: no value."""
    if not drawable(table):
        return None
    column = table.columns[-1]
    cells = [(row.label, row.cell(column)) for row in table.rows]
    drawn = [(label, c) for label, c in cells if c is not None]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(4.0, 1.2 * len(drawn) + 2), 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(drawn))
    means = [c[0] for _, c in drawn]
    errors = [0.0 if c[1] is None else c[1] for _, c in drawn]
    ax.bar(x, means, yerr=errors, capsize=4, color=[f"C{i}" for i in range(len(drawn))])
    ax.set_xticks(x, [label for label, _ in drawn], rotation=20, ha="right")
    ax.set_ylabel(f"{column}: mean@k at the budget")
    ax.set_title(f"Held-out accuracy at {table.budget:,.0f} generated tokens (±1 binomial SE)")
    fig.tight_layout()
    return fig
