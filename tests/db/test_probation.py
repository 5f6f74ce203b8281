"""`lesson_history.probation` (migration 0019): every state from lessons written through the record path, the rule
checked row by row against the view's own interval, a hand retirement that keeps the evidence state, and the
migration both ways with the reader still reading the view."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from probation_helpers import fill_probation
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db import migrate
from lanpo.db.readonly import query_readonly
from lanpo.db.repo import lessons
from lanpo.db.repo import runs as runs_repo

EVIDENCE = "version_id, graded, lift, lift_low, lift_high, evicted_by"
ROWS = sa.text(f"SELECT {EVIDENCE}, probation FROM lesson_history ORDER BY 1")


def probation_of(graded: int, lift_low: float | None, lift_high: float | None, evicted_by: str | None) -> str:
    """The rule, one branch per state, in the view's order."""
    if evicted_by == "retired:harmful":
        return "retired"
    if graded == 0:
        return "untried"
    assert lift_low is not None and lift_high is not None
    if lift_low > 0:
        return "helps"
    if lift_high < 0:
        return "hurts"
    return "trying"


@pytest.fixture
def states(session: Session) -> dict[str, int]:
    run = runs_repo.create_run(session, "probation", "eval", {}).id
    return fill_probation(session, run, mode="retrieval")


def test_every_state_from_the_record_path(session: Session, states: dict[str, int]) -> None:
    rows = {r.version_id: r for r in session.execute(ROWS)}
    assert {s: rows[v].probation for s, v in states.items()} == {
        "helps": "helps", "hurts": "hurts", "trying": "trying", "retired": "retired", "untried": "untried",
        "retired_v1": "retired",  # the retired lesson's every version, its unused first one too
    }  # fmt: skip
    for r in rows.values():
        assert r.probation == probation_of(r.graded, r.lift_low, r.lift_high, r.evicted_by)
        assert r.probation in lessons.PROBATION
    # the evidence behind each: an interval that clears 0 on one side, one that spans it, none without a grade
    helps, hurts, trying = rows[states["helps"]], rows[states["hurts"]], rows[states["trying"]]
    assert (helps.lift, hurts.lift, trying.lift) == (1.0, -1.0, 0.0)
    assert helps.lift_low > 0 and hurts.lift_high < 0 and trying.lift_low < 0 < trying.lift_high
    assert (rows[states["untried"]].graded, rows[states["untried"]].lift) == (0, None)
    retired = rows[states["retired"]]
    assert retired.evicted_by == "retired:harmful" and retired.lift_high < 0


def test_a_lesson_retired_by_hand_keeps_its_evidence_state(session: Session, states: dict[str, int]) -> None:
    lesson = session.scalar(sa.text("SELECT experience_id FROM lesson_history WHERE version_id = :v"),
                            {"v": states["helps"]})  # fmt: skip
    lessons.retire(session, lesson, "helps, but we rewrote the topic")
    (row,) = lessons.history(session, lesson)
    assert (row.active, row.evicted_by, row.probation) == (False, lessons.RETIRED_BY, "helps")
    (shown,) = lessons.retired_as_harmful(session, "probation-retire")
    assert (shown.version_id, shown.probation) == (states["retired"], "retired")


def test_downgrade_restores_0018s_view_and_the_reader_reads_both(db: Engine) -> None:
    with Session(db) as s, s.begin():
        run = runs_repo.create_run(s, "probation-migration", "eval", {}).id
        states = fill_probation(s, run, name="probation-migration", mode="retrieval")
    evidence = sa.text(f"SELECT {EVIDENCE} FROM lesson_history ORDER BY 1")
    with db.connect() as conn:
        before = conn.execute(evidence).all()
    migrate.downgrade(db, "0018")
    try:
        with db.connect() as conn:
            columns = [c["name"] for c in sa.inspect(conn).get_columns("lesson_history")]
            assert columns[-1] == "lift_high" and "probation" not in columns
            assert conn.execute(evidence).all() == before  # every other column as it was
        assert query_readonly(db, "SELECT count(*) FROM lesson_history").rows == [(len(before),)]
    finally:
        migrate.upgrade(db)
    with db.connect() as conn:  # probation, then the fit's columns (migration 0024)
        names = [c["name"] for c in sa.inspect(conn).get_columns("lesson_history")]
        assert names[-3:] == ["probation", "net_credit", "net_credit_var"]
    reader = query_readonly(db, f"SELECT probation FROM lesson_history WHERE version_id = {states['helps']}")
    assert reader.rows == [("helps",)]
