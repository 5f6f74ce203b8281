"""The report's lesson lift figure: a training run whose groups used lessons in every probation state, written
through the record path; the figure's points, read back from its artists, are the view's values; the PNG, the CSV
and report.md's section; a run that used none gets none of them."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
import sqlalchemy as sa
from matplotlib.colors import to_rgba
from sqlalchemy.orm import Session

from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.report import lesson_lift
from lanpo.report.build import read_report, write_report
from tests.db.probation_helpers import fill_probation
from tests.db.store_helpers import make_experiences, make_problems
from tests.report.helpers import make_run, write_run
from tests.report.test_cli import assert_has_content

HISTORY = sa.text(
    "SELECT experience_id, version_id, version, uses, graded, lift, lift_low, lift_high, probation "
    "FROM lesson_history WHERE version_id = ANY(:v)"
)


def _used_run(session: Session) -> tuple[int, dict[str, int], dict[str, int]]:
    """Run `lessons` (metrics as the trainer writes them) with a lesson in each state; run `other` uses lessons of
    its own, which the report of `lessons` must leave out. Returns (run id, its states' versions, other's)."""
    run = make_run(session, "lessons")
    write_run(session, run, "grpo", 0, "both", steps=2)
    used = fill_probation(session, run)
    other = fill_probation(session, make_run(session, "other"), name="elsewhere")
    return run, used, other


def _points_drawn(figure: object) -> dict[str, list[tuple[float, float, float, float]]]:
    """Probation state -> (x, y, low, high) of each error bar, read back from the figure's artists."""
    (ax,) = figure.axes  # type: ignore[attr-defined]
    out = {}
    for container in ax.containers:
        point, _, (bars,) = container.lines
        state, _, count = container.get_label().partition(" (")
        assert to_rgba(point.get_color()) == to_rgba(lesson_lift.STYLE[state][0])
        assert point.get_marker() == lesson_lift.STYLE[state][1]
        segments = bars.get_segments()
        rows = zip(point.get_xdata(), point.get_ydata(), segments, strict=True)
        out[state] = [(float(x), float(y), float(s[0][1]), float(s[1][1])) for x, y, s in rows]
        assert count == f"{len(out[state])})"
    return out


def test_the_figures_points_are_the_views_values(session: Session) -> None:
    _, used, other = _used_run(session)
    data = read_report(session, ["lessons"])
    carried = {v for state, v in used.items() if state != "retired_v1"}  # the retired lesson's first version: unused
    assert {p.version_id for p in data.lessons} == carried and not {p.version_id for p in data.lessons} & set(
        other.values()
    )
    view = {r.version_id: r for r in session.execute(HISTORY, {"v": list(carried)})}
    for p in data.lessons:
        row = view[p.version_id]
        assert (p.experience_id, p.version, p.uses, p.graded, p.lift, p.lift_low, p.lift_high, p.probation) == (
            row.experience_id, row.version, row.uses, row.graded, row.lift, row.lift_low, row.lift_high, row.probation
        )  # fmt: skip
        assert p.run_uses == p.uses  # no other run used these
    assert {p.probation: p.version_id for p in data.lessons} == {s: used[s] for s in lesson_lift.PROBATION}

    figure = lesson_lift.draw(data.lessons)
    drawn = _points_drawn(figure)
    assert list(drawn) == ["retired", "helps", "hurts", "trying"]  # untried: no lift, no point
    for state, points in drawn.items():
        row = view[used[state]]
        assert points == [pytest.approx((row.graded, row.lift, row.lift_low, row.lift_high))]
    assert drawn["helps"][0][2] > 0 > drawn["hurts"][0][3] and drawn["trying"][0][2] < 0 < drawn["trying"][0][3]
    (ax,) = figure.axes  # type: ignore[union-attr]
    assert ax.get_xscale() == "log" and ax.get_legend().get_texts()[-1].get_text() == "untried (1): no point"


def test_the_report_writes_the_figure_the_csv_and_says_so(session: Session, tmp_path: Path) -> None:
    _, used, _ = _used_run(session)
    result = write_report(read_report(session, ["lessons"]), tmp_path / "out")
    out = tmp_path / "out"
    assert lesson_lift.FIGURE in result.figures
    assert_has_content(out / lesson_lift.FIGURE)
    rows = list(csv.DictReader(io.StringIO((out / lesson_lift.CSV).read_text())))
    assert {int(r["version_id"]): r["probation"] for r in rows} == {used[s]: s for s in lesson_lift.PROBATION}
    untried = next(r for r in rows if r["probation"] == "untried")
    assert (untried["graded"], untried["lift"], untried["lift_low"]) == ("0", "", "")
    helps = next(r for r in rows if r["probation"] == "helps")
    assert (float(helps["lift"]), int(helps["run_uses"])) == (1.0, 2) and math.isfinite(float(helps["lift_low"]))
    report = (out / "report.md").read_text()
    assert "### Lessons used: lift against graded attempts" in report
    assert "The 5 lesson version(s) a rollout group of this run carried (1 retired, 1 untried, 1 helps, " in report
    assert f"![lift against graded attempts]({lesson_lift.FIGURE})" in report


def test_lessons_used_but_none_graded_and_none_used(session: Session, tmp_path: Path) -> None:
    """A run whose only lesson use has no baseline (no zero-shot attempt at or before its step): the CSV and the
    section, no figure. A run without lesson uses: none of them (tests/report/test_cli.py's experiment holds none
    and lists every file it writes)."""
    run = make_run(session, "untried")
    write_run(session, run, "grpo", 0, "both", steps=2)
    (problem,) = make_problems(session, 1, dataset="untried")
    (version,) = make_experiences(session, problem, 1)
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [NewGroup(problem, "inter", "q", [NewAttempt("r", 1.0, True)], step=0, run_id=run,
                                     contexts=lesson)])  # fmt: skip
    data = read_report(session, ["untried"])
    assert [(p.version_id, p.uses, p.probation) for p in data.lessons] == [(version, 1, "untried")]
    assert lesson_lift.draw(data.lessons) is None
    result = write_report(data, tmp_path / "out")
    assert lesson_lift.FIGURE not in result.figures and (tmp_path / "out" / lesson_lift.CSV).is_file()
    assert "No figure: none of them has a graded attempt yet." in (tmp_path / "out" / "report.md").read_text()
    write_run(session, make_run(session, "unused"), "grpo", 0, "none", steps=2)
    assert read_report(session, ["unused"]).lessons == []
