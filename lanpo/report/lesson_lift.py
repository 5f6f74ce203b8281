"""The lessons a report's runs used: each version's lift against its graded attempts, with its 95 % interval and
its probation state, as `lesson_history` gives them (docs/concepts.md, "Probation").

A version is in the figure when one of the runs' rollout groups carried it (a row of `lesson_uses`); its numbers
are its record over the whole store at the time of the report, not the runs' share of it (`run_uses` in the CSV
says how many of its uses were theirs). x is its graded attempts, the evidence the interval rests on, on a log
axis (the interval narrows roughly as 1 / sqrt(graded)); y is lift = net_credit / graded, the error bar lift_low ..
lift_high; colour and marker say its probation: retired, helps, hurts or trying. An untried version (nothing
graded, no lift) has no point: the legend counts it. Read, then pure functions and one figure.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo.lessons import PROBATION

FIGURE = "lesson_lift.png"
CSV = "lesson_lift.csv"
# probation -> (colour, marker); untried versions have no lift, so no point
STYLE = {"retired": ("0.25", "X"), "helps": ("tab:green", "^"), "hurts": ("tab:red", "v"), "trying": ("tab:blue", "o")}


@dataclass(frozen=True)
class LessonPoint:
    """One lesson version the runs used, with its record from `lesson_history`."""

    experience_id: int
    version_id: int
    version: int
    run_uses: int  # the report's runs' groups that carried it
    uses: int  # every group that carried it, in any run
    graded: int  # graded attempts with a baseline: x
    lift: float | None  # net_credit / graded: y (None when untried)
    lift_low: float | None  # lift's 95 % interval
    lift_high: float | None
    probation: str  # one of lanpo.db.repo.lessons.PROBATION


def read_points(session: Session, run_ids: Sequence[int]) -> list[LessonPoint]:
    """The versions the runs `run_ids` used, by lesson and version (sql/queries/report_lesson_lift.sql)."""
    rows = session.execute(sqlfiles.load("queries/report_lesson_lift"), {"run_ids": list(run_ids)})
    return [LessonPoint(**r._mapping) for r in rows]


def by_state(points: Sequence[LessonPoint]) -> dict[str, list[LessonPoint]]:
    """The points with a lift, by probation state, in PROBATION's order (states without a point left out)."""
    drawn = [p for p in points if p.lift is not None and p.lift_low is not None and p.lift_high is not None]
    return {s: found for s in PROBATION if (found := [p for p in drawn if p.probation == s])}


def counts(points: Sequence[LessonPoint]) -> dict[str, int]:
    """How many versions are in each probation state, in PROBATION's order (states with none left out)."""
    found = Counter(p.probation for p in points)
    return {s: found[s] for s in PROBATION if found[s]}


def draw(points: Sequence[LessonPoint]) -> Figure | None:
    """Lift against graded attempts, one error bar (the 95 % interval) per version, coloured by probation; None when
    no version has a lift."""
    states = by_state(points)
    if not states:
        return None
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    ax.axhline(0.0, color="0.5", linestyle=":", linewidth=1)
    for state, found in states.items():
        colour, marker = STYLE[state]
        lift = [p.lift for p in found]
        below = [p.lift - p.lift_low for p in found]  # type: ignore[operator]
        above = [p.lift_high - p.lift for p in found]  # type: ignore[operator]
        ax.errorbar(
            [p.graded for p in found], lift, yerr=[below, above], fmt=marker, color=colour, ecolor=colour,
            elinewidth=1, capsize=2, markersize=6, alpha=0.85, label=f"{state} ({len(found)})",
        )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("graded attempts (log scale)", fontsize=9)
    ax.set_ylabel("lift over the zero-shot baseline", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    untried = counts(points).get("untried", 0)
    if untried:
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(f"untried ({untried}): no point")
    ax.legend(handles, labels, fontsize=8, loc="best", title="probation", title_fontsize=8)
    fig.suptitle("Lessons used: lift against graded attempts (95 % interval)", fontsize=11)
    return fig


def to_csv(points: Sequence[LessonPoint]) -> str:
    """One line per version, every field of LessonPoint (empty where None)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    names = [f.name for f in fields(LessonPoint)]
    writer.writerow(names)
    for p in points:
        writer.writerow(["" if getattr(p, n) is None else getattr(p, n) for n in names])
    return buffer.getvalue()
