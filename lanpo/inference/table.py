"""mean@k tables shaped like the paper's Table 1: rows are modes, columns are datasets and their average.

mean@k of one (mode, dataset) cell = the mean over problems of the fraction of a problem's k sampled answers
that are correct (= plain accuracy over all samples when every problem has k of them). The average column is
the unweighted mean of a row's dataset cells, as in the paper. Pure functions: the evaluation builds a table
from its solutions and `recount` rebuilds it from the stored attempts, and the two must agree.
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

        def pct(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:.1f}"

        label = f"mean@{self.k}" if self.k else "mean@k"
        out = [[label, *self.datasets, "Average"]]
        for mode in self.modes:
            cells = [self.cells.get((mode, d)) for d in self.datasets]
            out.append([row_label(mode), *(pct(c.mean if c else None) for c in cells), pct(self.average(mode))])
        return out

    def to_markdown(self) -> str:
        rows = self.rows()
        lines = ["| " + " | ".join(rows[0]) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(rows[0]) - 1)) + " |"]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """Machine-readable: one line per (mode, dataset) cell plus each mode's average, means as fractions."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["mode", "dataset", "mean_at_k", "problems", "samples"])
        for mode in self.modes:
            for d in self.datasets:
                c = self.cells.get((mode, d))
                if c is not None:
                    writer.writerow([mode, d, f"{c.mean:.6f}", c.problems, c.samples])
            avg = self.average(mode)
            if avg is not None:
                writer.writerow([mode, "average", f"{avg:.6f}", "", ""])
        return buffer.getvalue()


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
    cells = {key: Cell(sum(v) / len(v), len(v), samples[key]) for key, v in per_cell.items()}
    return Table(list(modes), list(datasets), k, cells)


def recount(
    session: Session, run_id: int, modes: Sequence[str], datasets: Sequence[str], k: int | None = None
) -> Table:
    """The table of a stored eval run, recounted in SQL from its final-turn attempts."""
    from lanpo.db.sqlfiles import load
    from lanpo.prompts import INTRA_VERSION

    rows = session.execute(load("queries/eval_mean_at_k"), {"run_id": run_id, "single_version": INTRA_VERSION}).all()
    cells = {(r.mode, r.dataset): Cell(float(r.mean_at_k), int(r.problems), int(r.samples)) for r in rows}
    return Table(list(modes), list(datasets), k, cells)
