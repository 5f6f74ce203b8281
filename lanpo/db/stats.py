"""Planner statistics kept fresh after bulk writes: the tables a commit grew are ANALYZEd before the next draw.

Postgres plans a query from the statistics ANALYZE last took (`pg_class.reltuples`, `pg_statistic`). Autovacuum
refreshes them once 50 + 10% of a table's rows changed, but on its own schedule (`autovacuum_naptime`, a minute by
default), and a trainer's first draws run seconds after the write that filled the pool. Planned on the statistics
of empty tables, the inter draw over 32,000 attempts and 16,000 lessons took 2.7 s; after an ANALYZE, 0.07 s
(`python bench/fresh_stats.py` measures it on 100,000 attempts).

So every bulk write notes the tables it wrote in its session, with the rows it added (`note_write`, called by
`lanpo.db.repo.bulk` and the few bulk INSERTs), and once that session's OUTERMOST transaction commits, each noted
table that has GROWN since its statistics were taken is analyzed, synchronously, in its own short transaction:

    grown  <=>  not empty, and:  reltuples <= 0 (never analyzed, or analyzed while its rows were invisible)
                                 or  pages now >= GROWTH x pages at the last ANALYZE
                                 or  rows this process added since it last analyzed it >= (GROWTH - 1) x reltuples

Pages (`pg_relation_size`) are known without counting anything and see every writer's rows; the rows this process
added see what pages miss: a first ANALYZE of a few rows on a page that then fills (16 relevance scores, then 700
on the same 9 pages: 44x off by pages alone). `GROWTH = 10` because a plan changes with the order of magnitude of
a table, not with a few percent: the statistics stay within 10x of the truth for a process's own writes (and by
pages for other processes'), and a pool that grows from 1 to 10^6 rows is analyzed about six times in all (each
ANALYZE samples at most 30,000 rows, tens of milliseconds); past its first steps autovacuum's own 10% rule keeps it
fresh. A table's first write is always analyzed, which covers an import, a relevance build and a new pool's first
step.

Only the outermost commit refreshes: SQLAlchemy also fires `after_commit` when a savepoint is released
(`Session.begin_nested`, which `lanpo data import` uses), while the rows are still invisible to any other
connection. An ANALYZE there counts none of 20,000 imported problems (reltuples 0 over 278 pages), and the
import's own commit, the tables already taken, would refresh nothing. A table left at reltuples 0 over pages (by
an older lanpo) is analyzed again by its next bulk write.

Each refresh is `ANALYZE (SKIP_LOCKED)`: a table another session is analyzing (or vacuuming) right now is skipped
rather than waited for, so concurrent writers never queue behind each other; run outside the writing transaction,
it holds its lock for the ANALYZE alone. A role that does not own a table gets Postgres's warning and no refresh;
a failed refresh is logged, never raised: the data is committed either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles

log = logging.getLogger(__name__)

GROWTH = 10  # analyze a table again once it may hold this many times the rows its statistics were taken at
_KEY = "lanpo_written_tables"  # Session.info key: {table: rows added} by the session's current transaction
# The tables lanpo writes in bulk; a refresh names only these (identifiers, never user input).
TABLES = frozenset(
    {
        "problems",
        "relevance_scores",
        "rollout_groups",
        "attempts",
        "attempt_tokens",
        "group_contexts",
        "experiences",
        "experience_versions",
        "meta_pairs",
        "meta_nll_uses",
    }
)
# (database, table) -> rows this process committed to the table since it last analyzed it. Threads of one process
# (a trainer's rollout queue) commit too, hence the lock.
_added: dict[tuple[str, str], int] = {}
_lock = threading.Lock()


def note_write(session: Session, *tables: str, rows: int = 0) -> None:
    """Record that `session`'s transaction wrote to `tables`, adding `rows` rows to each (0: it only changed rows);
    they are refreshed, if they grew, once its outermost transaction commits."""
    unknown = set(tables) - TABLES
    if unknown:
        raise ValueError(f"not a bulk-written table: {sorted(unknown)}")
    noted = session.info.setdefault(_KEY, {})
    for table in tables:
        noted[table] = noted.get(table, 0) + rows


def stale_tables(conn: Connection, tables: Iterable[str], added: Mapping[str, int] | None = None) -> list[str]:
    """Which of `tables` have grown since their statistics were taken (the rule in the module docstring); `added`:
    the rows this process added to each since it last analyzed it."""
    names = sorted(set(tables) & TABLES)
    if not names:
        return []
    added = added or {}
    rows = conn.execute(sqlfiles.load("queries/table_growth"), {"tables": names}).all()
    return [
        r.name
        for r in rows
        if r.pages > 0
        and (
            r.reltuples <= 0
            or r.pages >= GROWTH * max(r.relpages, 1)
            or added.get(r.name, 0) >= (GROWTH - 1) * r.reltuples
        )
    ]


def _database(db: Engine) -> str:
    return db.url.render_as_string(hide_password=True)


def refresh(bind: Engine | Connection, tables: Iterable[str], force: bool = False) -> list[str]:
    """ANALYZE those of `tables` that grew (all of them with `force`), in autocommit; returns the ones analyzed."""
    db = bind.engine if isinstance(bind, Connection) else bind
    database = _database(db)
    with _lock:
        added = {table: _added.get((database, table), 0) for table in tables}
    with db.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        names = sorted(set(tables) & TABLES) if force else stale_tables(conn, tables, added)
        if names:
            conn.exec_driver_sql(f"ANALYZE (SKIP_LOCKED) {', '.join(names)}")
    if names:
        with _lock:  # a table skipped as locked is being analyzed by another session: counted from here too
            for name in names:
                _added.pop((database, name), None)
        log.debug("analyzed %s", ", ".join(names))
    return names


@event.listens_for(Session, "after_commit")
def _refresh_after_commit(session: Session) -> None:
    # SQLAlchemy fires after_commit for a savepoint's RELEASE too; its rows are not visible to the connection an
    # ANALYZE runs on until the outermost transaction commits (the module docstring).
    if session.in_nested_transaction():
        return
    noted: dict[str, int] | None = session.info.pop(_KEY, None)
    if not noted or not enabled:
        return
    bind = session.get_bind()
    db = bind.engine if isinstance(bind, Connection) else bind
    database = _database(db)
    with _lock:
        for table, rows in noted.items():
            _added[(database, table)] = _added.get((database, table), 0) + rows
    try:
        refresh(bind, noted)
    except sa.exc.SQLAlchemyError:  # the rows are committed; stale statistics only slow the next plans
        log.warning("could not refresh the planner statistics of %s", ", ".join(sorted(noted)), exc_info=True)


@event.listens_for(Session, "after_rollback")
def _forget_on_rollback(session: Session) -> None:
    if session.in_nested_transaction():  # a savepoint's rollback: what the outer transaction wrote still commits
        return
    session.info.pop(_KEY, None)


enabled = True  # bench/fresh_stats.py switches it off for its blind reference; nothing else should
