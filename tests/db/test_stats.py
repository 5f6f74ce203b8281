"""Planner statistics after bulk writes (lanpo.db.stats): a committed write leaves the statistics of what it grew
within GROWTH x of the truth before the next statement runs; rollbacks refresh nothing; a refresh never waits for
another session's ANALYZE."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import make_pool, make_problems, write_training_steps

from lanpo.db import stats
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from tests.conftest import truncate_all


@pytest.fixture(autouse=True)
def _fresh_statistics(db: Engine) -> None:
    """These tests read the planner's statistics: each starts from tables as a fresh store has them (TRUNCATE resets
    the statistics, the `db` fixture's DELETE between tests does not)."""
    truncate_all(db)


def _tuples(session: Session, table: str) -> tuple[float, int]:
    """(reltuples: the planner's row count, -1 before any ANALYZE; the true count)."""
    planned = session.scalar(sa.text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table})
    return float(planned), int(session.scalar(sa.text(f"SELECT count(*) FROM {table}")))


def _groups(problem_ids: list[int], n: int, step: int) -> list[NewGroup]:
    return [
        NewGroup(p, "zero_shot", "prompt " * 20, [NewAttempt(f"rollout {j} of {p}, " * 8, 0.0, False)
                                                   for j in range(n)], step=step)
        for p in problem_ids
    ]  # fmt: skip


def test_the_statistics_follow_a_growing_pool_within_the_growth_factor(session: Session) -> None:
    """Step after step, as a young pool grows: right after each commit the planner's count of attempts is within
    GROWTH x of the true count (never the -1 of a table never analyzed), and it was refreshed only a few times."""
    pids = make_problems(session, 64)
    session.commit()
    assert _tuples(session, "attempts") == (-1.0, 0)  # emptied by the last test's TRUNCATE: never analyzed
    refreshed = 0
    last = -1.0
    for step in range(1, 41):
        record_groups(session, _groups(pids, 8, step))
        session.commit()
        planned, true = _tuples(session, "attempts")
        assert true / stats.GROWTH <= planned <= true, (step, planned, true)
        refreshed += planned != last
        last = planned
    assert 2 <= refreshed <= 4, refreshed  # 512 -> 20,480 rows: analyzed at the first step and about every 10x


def test_the_first_draw_after_a_bulk_write_is_planned_on_its_rows(session: Session) -> None:
    """An import, a step's attempts and its lessons: each table is analyzed by the commit that first fills it."""
    pids = make_problems(session, 200)
    session.commit()
    assert _tuples(session, "problems") == (200.0, 200)
    write_training_steps(session, [pids], 4, 2, make_pool(session))
    for table, rows in (("rollout_groups", 200), ("attempts", 800), ("experiences", 400)):
        assert _tuples(session, table) == (float(rows), rows), table


def test_a_rolled_back_write_refreshes_nothing(session: Session) -> None:
    pids = make_problems(session, 8)
    session.commit()
    record_groups(session, _groups(pids, 4, 1))
    session.rollback()
    assert _tuples(session, "attempts") == (-1.0, 0)
    assert "lanpo_written_tables" not in session.info
    session.execute(sa.text("SELECT 1"))
    session.commit()  # a later commit that wrote nothing refreshes nothing either
    assert _tuples(session, "attempts") == (-1.0, 0)


def test_only_the_outermost_commit_refreshes(session: Session) -> None:
    """A savepoint's release does not analyze (its rows are invisible to the ANALYZE's connection) and a savepoint's
    rollback does not forget what the transaction around it wrote: both wait for the outermost commit."""
    pids = make_problems(session, 8)
    session.commit()
    record_groups(session, _groups(pids, 4, 1))  # 8 groups, 32 attempts, before the savepoint
    savepoint = session.begin_nested()
    record_groups(session, _groups(pids, 4, 2))
    savepoint.rollback()
    savepoint = session.begin_nested()
    make_problems(session, 100, dataset="more")  # >= (GROWTH - 1) x 8: grown
    savepoint.commit()
    assert _tuples(session, "problems") == (8.0, 108)  # released, not yet analyzed
    assert _tuples(session, "attempts") == (-1.0, 32)
    session.commit()
    assert _tuples(session, "problems") == (108.0, 108)
    assert _tuples(session, "attempts") == (32.0, 32)


def test_the_growth_rule(db: Engine) -> None:
    with db.connect() as conn:
        assert stats.stale_tables(conn, ["attempts"]) == []  # empty and never analyzed: nothing to plan on
        assert stats.stale_tables(conn, ["pg_class", "no_such_table"]) == []  # only lanpo's bulk tables
    with pytest.raises(ValueError, match="not a bulk-written table"):
        stats.note_write(Session(db), "runs")


def test_a_refresh_skips_a_table_another_session_is_analyzing(db: Engine, session: Session) -> None:
    """SKIP_LOCKED: a commit whose table is locked by another ANALYZE (or VACUUM) does not wait for it."""
    pids = make_problems(session, 8)
    session.commit()
    locked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with db.connect() as conn, conn.begin():
            conn.execute(sa.text("LOCK TABLE attempts IN SHARE UPDATE EXCLUSIVE MODE"))  # what ANALYZE takes
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        record_groups(session, _groups(pids, 4, 1))
        started = time.perf_counter()
        session.commit()
        assert time.perf_counter() - started < 5
        assert _tuples(session, "attempts") == (-1.0, 32)  # skipped, not waited for
        assert _tuples(session, "rollout_groups") == (8.0, 8)  # the unlocked table of the same write was analyzed
    finally:
        release.set()
        holder.join()
