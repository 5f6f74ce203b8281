"""Bulk writes with COPY inside the caller's transaction: reserve ids, then stream rows (psycopg cursor.copy).

COPY is several times faster than INSERT for the thousands of rows a training step writes. Ids come from
the tables' identity sequences (reserved first, so callers know them without RETURNING). Constraint
violations (a missing problem, run, attempt...) become InputError; the transaction is then aborted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles, stats
from lanpo.errors import InputError


def reserve_ids(session: Session, table: str, n: int) -> list[int]:
    """`n` fresh ids of `table`'s identity sequence, ascending."""
    if n <= 0:
        return []
    return sorted(session.scalar(sqlfiles.load("queries/reserve_ids"), {"table": table, "n": n}))


def _copy_target(text: str) -> str:
    """The table a `COPY table (...) FROM STDIN` statement writes."""
    found = re.search(r"^COPY\s+(\w+)", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"not a COPY statement: {text[:80]!r}")
    return found.group(1)


def copy_rows(
    session: Session, statement: str, rows: Iterable[Sequence[Any]], types: Sequence[str] | None, what: str
) -> None:
    """Run COPY `sql/<statement>.sql` with `rows` on the session's connection (binary when `types` are given).
    The table is noted for a statistics refresh once the session commits (`lanpo.db.stats`)."""
    text = sqlfiles.text_of(statement)
    table = _copy_target(text)
    conn: psycopg.Connection = session.connection().connection.driver_connection  # type: ignore[assignment]
    written = 0
    try:
        with conn.cursor() as cur, cur.copy(text) as copy:
            if types is not None:
                copy.set_types(list(types))
            for row in rows:
                copy.write_row(row)
                written += 1
    except psycopg.errors.IntegrityError as exc:
        detail = exc.diag.message_detail or exc.diag.message_primary or str(exc)
        raise InputError(
            f"cannot record {what}: {detail}",
            hint="refer only to problems, runs, attempts, policy and experience versions that exist",
        ) from exc
    stats.note_write(session, table, rows=written)
