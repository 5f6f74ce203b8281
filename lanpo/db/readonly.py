"""Run one user-supplied SQL statement as the read-only role: `lanpo sql`, the demo and the tests use this.

Three fences, each enough against writes on its own: the role (`lanpo.db.reader`: SELECT on lanpo's tables
and views only, checked before anything runs), a READ ONLY transaction that is always rolled back, and one
statement per call (sent with the extended protocol, so `; COMMIT; DELETE ...` is refused by the server).
A statement timeout bounds the time; rows are streamed and at most `max_rows` are fetched.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy.engine import Engine

from lanpo.db.reader import reader_login
from lanpo.errors import InputError


@dataclass(frozen=True)
class SqlLimits:
    timeout_s: float = 60.0  # statement timeout; the query is cancelled past it
    max_rows: int = 1000  # rows fetched and printed at most (0: all of them)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise InputError(f"the SQL timeout must be above 0 s, not {self.timeout_s}", hint="--timeout 60")
        if self.max_rows < 0:
            raise InputError(f"--max-rows must be 0 (no cap) or more, not {self.max_rows}", hint="--max-rows 1000")


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False  # the query returned more than `max_rows` rows


def query_readonly(
    db: Engine, statement: str, limits: SqlLimits | None = None, source: str = "the statement"
) -> QueryResult:
    """Run ONE statement as the read-only role and return its columns and rows; errors become InputError.

    `engine` is the owner's: lanpo reads the reader's login with it and never runs user SQL through it.
    """
    limits = limits or SqlLimits()
    if not statement.strip():
        raise InputError(f"no SQL statement in {source}: it is empty", hint=EXAMPLE)
    with contextlib.closing(reader_login(db).connect()) as conn:
        try:
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute("SELECT set_config('statement_timeout', %s, true)", [f"{limits.timeout_s * 1000:.0f}ms"])
                columns = _describe(conn, statement)
                if columns is None:
                    cur.execute(statement, prepare=True)  # type: ignore[arg-type]
                    if cur.pgresult is not None and cur.pgresult.status == pq.ExecStatus.EMPTY_QUERY:
                        raise InputError(f"no SQL statement in {source}: only comments", hint=EXAMPLE)
                    return QueryResult([], [])
                rows: list[tuple[Any, ...]] = []
                with contextlib.closing(cur.stream(statement)) as stream:  # type: ignore[arg-type]
                    for row in stream:
                        if limits.max_rows and len(rows) == limits.max_rows:
                            return QueryResult(columns, rows, truncated=True)  # closing cancels the rest
                        rows.append(row)
                return QueryResult(columns, rows)
        except psycopg.Error as exc:
            raise _refusal(exc, limits) from exc
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()


EXAMPLE = 'lanpo sql "SELECT * FROM pool_current LIMIT 5"'


def _describe(conn: psycopg.Connection, statement: str) -> list[str] | None:
    """The statement's result columns (None: it returns no rows), from parsing it without running it."""
    pgconn = conn.pgconn
    parsed = pgconn.prepare(b"", statement.encode(conn.info.encoding))
    if parsed.status == pq.ExecStatus.FATAL_ERROR:
        raise psycopg.errors.error_from_result(parsed, encoding=conn.info.encoding)
    described = pgconn.describe_prepared(b"")
    if described.nparams:
        raise InputError(
            f"the statement has {described.nparams} parameter(s) ($1 ...), and lanpo sql passes none",
            hint="write the values into the statement",
        )
    if not described.nfields:
        return None
    return [(described.fname(i) or b"").decode(conn.info.encoding) for i in range(described.nfields)]


def _refusal(exc: psycopg.Error, limits: SqlLimits) -> InputError:
    """One clear message per way a statement is refused; in each, nothing was changed."""
    message = (exc.diag.message_primary or str(exc)).strip()
    if isinstance(exc, psycopg.errors.QueryCanceled) and "timeout" in message:
        return InputError(
            f"the statement ran past {limits.timeout_s:g} s and was cancelled; nothing was changed",
            hint="raise the limit with --timeout SECONDS (or LANPO_SQL_TIMEOUT), or narrow the query",
        )
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return InputError(
            f"refused: `lanpo sql` is read-only and this statement writes ({message}); nothing was changed",
            hint="change the store through lanpo commands (data import, train, ...)",
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return InputError(
            f"refused: the read-only role may not do this ({message}); nothing was changed",
            hint="lanpo sql may SELECT from lanpo's tables and views, and nothing else",
        )
    if exc.sqlstate is None and "COPY" in message:  # psycopg refuses COPY TO STDOUT in words naming its API
        return InputError(
            "COPY ... TO STDOUT is not for lanpo sql; nothing was run",
            hint='lanpo sql --format csv "SELECT ...", or \\copy in lanpo db psql',
        )
    if "multiple commands" in message:
        return InputError(
            "one SQL statement at a time, please; nothing was run",
            hint="split the file, or run each statement separately",
        )
    return InputError(f"SQL error: {message}", hint=exc.diag.message_hint)
