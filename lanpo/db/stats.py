"""Planner statistics kept fresh after bulk writes: the tables a commit grew are ANALYZEd before the next draw.

Postgres plans a query from the statistics ANALYZE last took (`pg_class.reltuples`, `pg_statistic`). Autovacuum
refreshes them once 50 + 10% of a table's rows changed, but on its own schedule (`autovacuum_naptime`, a minute by
default), and a trainer's first draws run seconds after the write that filled the pool. Planned on the statistics
of empty tables, the inter draw over 32,000 attempts and 16,000 lessons took 2.7 s; after an ANALYZE, 0.07 s
(issue 35; `python bench/fresh_stats.py` measures it on 100,000 attempts).

So every bulk write notes the tables it wrote in its session (`note_write`, called by `lanpo.db.repo.bulk` and the
few bulk INSERTs), and once that session commits, each noted table that has GROWN since its statistics were taken
is analyzed, synchronously, in its own short transaction:

    grown  <=>  never analyzed (reltuples < 0) and not empty,  or  pages now >= GROWTH x pages at the last ANALYZE

Pages (`pg_relation_size`), not rows, because they are known without counting anything. `GROWTH = 10` because a
plan changes with the order of magnitude of a table, not with a few percent: the statistics stay within 10x of
the truth, and a pool that grows from 1 to 10^6 rows is analyzed about six times in all (each ANALYZE samples at
most 30,000 rows, tens of milliseconds); past its first steps autovacuum's own 10% rule keeps it fresh. A table's
first write is always analyzed, which covers an import, a relevance build and a new pool's first step.

Each refresh is `ANALYZE (SKIP_LOCKED)`: a table another session is analyzing (or vacuuming) right now is skipped
rather than waited for, so concurrent writers never queue behind each other; run outside the writing transaction,
it holds its lock for the ANALYZE alone. A role that does not own a table gets Postgres's warning and no refresh;
a failed refresh is logged, never raised: the data is committed either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles

log = logging.getLogger(__name__)

GROWTH = 10  # analyze a table again once it holds this many times the pages its statistics were taken at
_KEY = "lanpo_written_tables"  # Session.info key: tables written in the session's current transaction
# The tables lanpo writes in bulk; a refresh names only these (identifiers, never user input).
TABLES = frozenset(
    {
        "problems",
        "relevance_scores",
        "rollout_groups",
        "attempts",
        "group_contexts",
        "experiences",
        "experience_versions",
        "meta_pairs",
        "meta_nll_uses",
    }
)


def note_write(session: Session, *tables: str) -> None:
    """Record that `session`'s transaction wrote rows to `tables` (refreshed, if they grew, after it commits)."""
    unknown = set(tables) - TABLES
    if unknown:
        raise ValueError(f"not a bulk-written table: {sorted(unknown)}")
    session.info.setdefault(_KEY, set()).update(tables)


def stale_tables(conn: Connection, tables: Iterable[str]) -> list[str]:
    """Which of `tables` have grown since their statistics were taken (the rule in the module docstring)."""
    names = sorted(set(tables) & TABLES)
    if not names:
        return []
    rows = conn.execute(sqlfiles.load("queries/table_growth"), {"tables": names}).all()
    return [r.name for r in rows if (r.reltuples < 0 and r.pages > 0) or r.pages >= GROWTH * max(r.relpages, 1)]


def refresh(bind: Engine | Connection, tables: Iterable[str], force: bool = False) -> list[str]:
    """ANALYZE those of `tables` that grew (all of them with `force`), in autocommit; returns the ones analyzed."""
    engine = bind.engine if isinstance(bind, Connection) else bind
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        names = sorted(set(tables) & TABLES) if force else stale_tables(conn, tables)
        if names:
            conn.exec_driver_sql(f"ANALYZE (SKIP_LOCKED) {', '.join(names)}")
    if names:
        log.debug("analyzed %s", ", ".join(names))
    return names


@event.listens_for(Session, "after_commit")
def _refresh_after_commit(session: Session) -> None:
    tables = session.info.pop(_KEY, None)
    if not tables or not enabled:
        return
    bind = session.get_bind()
    try:
        refresh(bind, tables)
    except sa.exc.SQLAlchemyError:  # the rows are committed; stale statistics only slow the next plans
        log.warning("could not refresh the planner statistics of %s", ", ".join(sorted(tables)), exc_info=True)


@event.listens_for(Session, "after_rollback")
def _forget_on_rollback(session: Session) -> None:
    session.info.pop(_KEY, None)


enabled = True  # bench/fresh_stats.py switches it off for its blind reference; nothing else should
