"""`lanpo report`: runs or experiments from the store -> PNG figures, report.md and table.csv in one folder.

`read_report` gathers everything inside one read transaction (and fails there, before anything is drawn, on an
unknown name, an unknown baseline arm or runs without a single metric): the runs' metrics, and the lesson versions
their groups used with their records; `write_report` draws and writes into a staging folder that replaces `out`
only when every file is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from lanpo.errors import InputError, listing
from lanpo.report import cost, lesson_lift, matched, plot
from lanpo.report.figures import CATALOGUE, validation_keys
from lanpo.report.markdown import Drawn, report_markdown
from lanpo.report.output import staged
from lanpo.report.read import Target, read_runs
from lanpo.report.series import Band, Line, RunData
from lanpo.report.table import ResultTable, result_table

BASELINE_ARM = "grpo"  # the arm paired differences are taken against, unless an arm without feedback or --baseline


@dataclass
class ReportData:
    title: str
    lines: list[Line]  # in table order: per experiment, its baseline arm first
    baselines: dict[str | None, Line]  # experiment -> its baseline arm
    lessons: list[lesson_lift.LessonPoint] = field(default_factory=list)  # the lesson versions the runs used


@dataclass
class ReportResult:
    out_dir: Path
    figures: list[str]  # PNG file names written
    not_recorded: list[str]  # figure titles left out
    table: ResultTable


def read_report(session: Session, names: Sequence[str], baseline: str | None = None) -> ReportData:
    targets, runs = read_runs(session, names)
    if not any(r.metrics for r in runs):
        named = ", ".join(t.name for t in targets)
        raise InputError(
            f"{named}: no metrics recorded yet",
            hint="a training run records its metrics when a step commits; report it after its first step",
        )
    for r in runs:
        if validation_keys([r]):  # the cost axes are drawn, and priced in the table, for validations only
            r.notes += cost.notes(r)
    if baseline is not None and not any(t.kind == "experiment" for t in targets):
        raise InputError("--baseline names an arm of an experiment", hint="report an experiment, or drop --baseline")
    lines: list[Line] = []
    baselines: dict[str | None, Line] = {}
    for target in targets:
        if target.kind == "run":
            lines += [Line(r.run.name, [r]) for r in runs if r.run.id == target.id]
            continue
        arms = _arms(target, [r for r in runs if r.run.experiment == target.name], prefix=len(targets) > 1)
        chosen = choose_baseline(target.name, arms, baseline)
        if chosen is not None:
            baselines[target.name] = chosen
            arms.remove(chosen)
            arms.insert(0, chosen)
        lines += arms
    lessons = lesson_lift.read_points(session, [r.run.id for r in runs])
    return ReportData(", ".join(t.name for t in targets), lines, baselines, lessons)


def _arms(target: Target, runs: list[RunData], prefix: bool) -> list[Line]:
    """The experiment's runs by arm (sorted by arm); a run without an arm is a line of its own."""
    by_arm: dict[str, list[RunData]] = {}
    for r in runs:
        by_arm.setdefault(r.run.arm or f"run {r.run.name}", []).append(r)
    return [
        Line(f"{target.name}/{arm}" if prefix else arm, members, target.name, arm)
        for arm, members in sorted(by_arm.items())
    ]


def choose_baseline(experiment: str, arms: list[Line], requested: str | None) -> Line | None:
    """The arm named `requested`; else the arm named grpo; else the one arm whose runs asked for no feedback."""
    if requested is not None:
        found = [a for a in arms if a.arm == requested]
        if not found:
            raise InputError(
                f"experiment {experiment!r} has no arm {requested!r}",
                hint=f"its arms: {listing(str(a.arm) for a in arms)}",
            )
        return found[0]
    named = [a for a in arms if (a.arm or "").lower() == BASELINE_ARM]
    plain = [a for a in arms if all(r.run.asked_p_t == 0 for r in a.runs)]
    return named[0] if len(named) == 1 else plain[0] if len(plain) == 1 else None


def write_report(data: ReportData, out: Path, band: Band = "minmax", command: str = "lanpo report") -> ReportResult:
    """Draw every figure with data, write report.md and table.csv; all of it appears in `out` at once."""
    runs = [r for line in data.lines for r in line.runs]
    table = result_table(data.lines, data.baselines)
    at_budget = matched.matched_table(data.lines)
    drawn: list[Drawn] = []
    files: list[str] = []
    with staged(out) as staging:
        for spec in CATALOGUE:
            panels = spec.panels(runs)
            kept = [p for p in panels if plot.has_data(p, data.lines)]
            result = Drawn(spec, kept, [p for p in panels if p not in kept])
            drawn.append(result)
            if result.file is not None:
                figure = plot.draw(spec.title, kept, data.lines, band)
                (staging / result.file).write_bytes(plot.png_bytes(figure))
                files.append(result.file)
        bars = matched.draw(at_budget)
        if bars is not None:
            (staging / matched.FIGURE).write_bytes(plot.png_bytes(bars))  # type: ignore[arg-type]
            files.append(matched.FIGURE)
            (staging / matched.CSV).write_text(at_budget.to_csv(), encoding="utf-8")
        if data.lessons:
            lifts = lesson_lift.draw(data.lessons)
            if lifts is not None:
                (staging / lesson_lift.FIGURE).write_bytes(plot.png_bytes(lifts))
                files.append(lesson_lift.FIGURE)
            (staging / lesson_lift.CSV).write_text(lesson_lift.to_csv(data.lessons), encoding="utf-8")
        read = {name for d in drawn for p in d.kept + d.missing for name in p.reads}
        unplotted = sorted({name for r in runs for name in r.metrics if not matched.is_read(name)} - read)
        text = report_markdown(
            data.title, command, datetime.now(UTC), data.lines, table, drawn, unplotted, band, at_budget, data.lessons
        )
        (staging / "report.md").write_text(text, encoding="utf-8")
        (staging / "table.csv").write_text(table.to_csv(), encoding="utf-8")
    return ReportResult(out, files, [d.spec.title for d in drawn if d.file is None], table)
