"""mean@k tables shaped like the paper's Table 1: rows are modes, columns are datasets and their average.

mean@k of one (mode, dataset) cell = the mean over problems of the fraction of a problem's k sampled answers
that are correct (= plain accuracy over all samples when every problem has k of them). The average column is
the unweighted mean of a row's dataset cells, as in the paper. Pure functions: the evaluation builds a table
from its solutions and `recount` rebuilds it from the stored attempts, and the two must agree.

MEL reports Pass@1 at temperature 0 and Avg@k / Pass@k at the sampling temperature (k = 8 at 0.6): Avg@k is
mean@k, Pass@k the share of problems with at least one correct sample (each cell carries it), and Pass@1 the mean@1
of a greedy pass (`lanpo eval` with `pass_at_1 = true`). `pass_rows` lays the three out in a second table.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

MODE_LABELS = {
    "zero_shot": "Zero-shot",
    "retrieval": "Retrieval",
    "self_correct": "Self-correct",
    "self_correct_single": "Self-correct (single turn)",
}


def row_label(row: str) -> str:
    """`zero_shot` -> `Zero-shot`; a Table 2 row `grpo/retrieval` -> `grpo × Retrieval`."""
    method, _, mode = row.rpartition("/")
    label = MODE_LABELS.get(mode, mode)
    return f"{method} × {label}" if method else label


@dataclass(frozen=True)
class Cell:
    """One table cell: mean@k in [0, 1] over `problems` problems and `samples` sampled answers."""

    mean: float
    problems: int
    samples: int
    pass_at_k: float | None = None  # share of problems with at least one correct sample


@dataclass
class Table:
    modes: list[str]
    datasets: list[str]
    k: int | None = None
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def average(self, mode: str) -> float | None:
        """Unweighted mean of the row's cells (None when the row has none)."""
        values = [self.cells[(mode, d)].mean for d in self.datasets if (mode, d) in self.cells]
        return sum(values) / len(values) if values else None

    def rows(self) -> list[list[str]]:
        """Header + one row per mode, values in percent with one decimal ('-' for an empty cell)."""
        label = f"mean@{self.k}" if self.k else "mean@k"
        out = [[label, *self.datasets, "Average"]]
        for mode in self.modes:
            cells = [self.cells.get((mode, d)) for d in self.datasets]
            out.append([row_label(mode), *(_pct(c.mean if c else None) for c in cells), _pct(self.average(mode))])
        return out

    def pass_rows(self, greedy: Table | None = None, temperature: float | None = None) -> list[list[str]]:
        """MEL's metrics per mode: Pass@1 (the greedy table's mean@1, when given), Avg@k and Pass@k of this table;
        columns as `rows()`."""
        k = self.k or "k"
        at = "" if temperature is None else f" (T={temperature:g})"
        out = [[f"Pass@1 · Avg@{k} · Pass@{k}", *self.datasets, "Average"]]
        for mode in self.modes:
            label = row_label(mode)
            metrics = [("mean", greedy, f"{label} Pass@1 (T=0)")] if greedy is not None else []
            metrics += [("mean", self, f"{label} Avg@{k}{at}"), ("pass_at_k", self, f"{label} Pass@{k}{at}")]
            for field_name, table, name in metrics:
                values = [getattr(table.cells.get((mode, d)), field_name, None) for d in self.datasets]
                present = [v for v in values if v is not None]
                out.append([name, *(_pct(v) for v in values), _pct(sum(present) / len(present) if present else None)])
        return out

    def to_markdown(self) -> str:
        return _markdown(self.rows())

    def to_csv(self, greedy: Table | None = None) -> str:
        """Machine-readable: one line per (mode, dataset) cell plus each mode's average, means as fractions; then
        pass@k and, from `greedy`, Pass@1 (empty where not measured)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["mode", "dataset", "mean_at_k", "problems", "samples", "pass_at_k", "pass_at_1"])

        def number(value: float | None) -> str:
            return "" if value is None else f"{value:.6f}"

        for mode in self.modes:
            for d in self.datasets:
                c = self.cells.get((mode, d))
                if c is not None:
                    first = greedy.cells.get((mode, d)) if greedy is not None else None
                    pass_at_1 = number(first.mean if first is not None else None)
                    writer.writerow([mode, d, f"{c.mean:.6f}", c.problems, c.samples, number(c.pass_at_k), pass_at_1])
            avg = self.average(mode)
            if avg is not None:
                writer.writerow([mode, "average", f"{avg:.6f}", "", "", "", ""])
        return buffer.getvalue()


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(rows[0]) - 1)) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


def pass_markdown(table: Table, greedy: Table | None = None, temperature: float | None = None) -> str:
    """`Table.pass_rows` as a markdown table."""
    return _markdown(table.pass_rows(greedy, temperature))


def mean_at_k(
    outcomes: Iterable[tuple[str, str, object, bool]],
    modes: Sequence[str],
    datasets: Sequence[str],
    k: int | None = None,
) -> Table:
    """Table from `(mode, dataset, problem key, correct)` per sampled final answer."""
    per_problem: dict[tuple[str, str, object], list[bool]] = defaultdict(list)
    for mode, dataset, problem, correct in outcomes:
        per_problem[(mode, dataset, problem)].append(bool(correct))
    per_cell: dict[tuple[str, str], list[float]] = defaultdict(list)
    samples: dict[tuple[str, str], int] = defaultdict(int)
    for (mode, dataset, _), answers in per_problem.items():
        per_cell[(mode, dataset)].append(sum(answers) / len(answers))
        samples[(mode, dataset)] += len(answers)
    cells = {
        key: Cell(sum(v) / len(v), len(v), samples[key], sum(x > 0 for x in v) / len(v)) for key, v in per_cell.items()
    }
    return Table(list(modes), list(datasets), k, cells)


def recount(
    session: Session, run_id: int, modes: Sequence[str], datasets: Sequence[str], k: int | None = None
) -> Table:
    """The table of a stored eval run, recounted in SQL from its final-turn attempts."""
    from lanpo.db.sqlfiles import load
    from lanpo.prompts import INTRA_VERSION

    rows = session.execute(load("queries/eval_mean_at_k"), {"run_id": run_id, "single_version": INTRA_VERSION}).all()
    cells = {
        (r.mode, r.dataset): Cell(float(r.mean_at_k), int(r.problems), int(r.samples), float(r.pass_at_k))
        for r in rows
    }
    return Table(list(modes), list(datasets), k, cells)
