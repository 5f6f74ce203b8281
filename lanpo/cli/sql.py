"""`lanpo sql`: query the store in a READ ONLY transaction and print a table, CSV or JSON.

One statement per call, sent as a prepared statement (a second statement such as `; COMMIT; DELETE ...`
is refused by the server), inside `SET TRANSACTION READ ONLY` and always rolled back: a write is refused
with a clear message and changes nothing.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg
from sqlalchemy.engine import Engine

from lanpo.db.engine import connect
from lanpo.errors import InputError


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def query_readonly(engine: Engine, statement: str) -> QueryResult:
    """Run ONE SQL statement read-only and return its columns and rows; errors become InputError."""
    if not statement.strip():
        raise InputError("no SQL given", hint='lanpo sql "SELECT * FROM pool_current LIMIT 5"')
    raw = engine.raw_connection()
    try:
        conn: psycopg.Connection = raw.driver_connection  # type: ignore[assignment]
        conn.rollback()
        with conn.cursor() as cur:
            try:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute(statement, prepare=True)  # type: ignore[arg-type]
                if cur.description is None:
                    return QueryResult([], [])
                return QueryResult([c.name for c in cur.description], list(cur.fetchall()))
            except psycopg.errors.ReadOnlySqlTransaction as exc:
                raise InputError(
                    f"refused: `lanpo sql` is read-only and this statement writes ({exc.diag.message_primary}); "
                    "nothing was changed",
                    hint="change the store through lanpo commands (data import, train, ...) or psql",
                ) from exc
            except psycopg.Error as exc:
                message = exc.diag.message_primary or str(exc).strip()
                if "multiple commands" in message:
                    raise InputError(
                        "one SQL statement at a time, please", hint="split the file, or run each statement separately"
                    ) from exc
                raise InputError(f"SQL error: {message}", hint=exc.diag.message_hint) from exc
            finally:
                conn.rollback()
    finally:
        raw.close()


def _cell(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict | list):
        return value
    if hasattr(value, "tolist"):  # numpy arrays (pgvector)
        return value.tolist()
    return value


def format_result(result: QueryResult, fmt: str, max_width: int = 60) -> str:
    """The result as an aligned table, CSV or JSON (a list of objects)."""
    if fmt == "json":
        return json.dumps([dict(zip(result.columns, map(_cell, r), strict=True)) for r in result.rows], default=str)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        for r in result.rows:
            writer.writerow(
                ["" if v is None else json.dumps(_cell(v)) if isinstance(v, dict | list) else v for v in r]
            )
        return out.getvalue().rstrip("\n")

    def text(v: Any) -> str:
        v = _cell(v)
        s = "NULL" if v is None else json.dumps(v) if isinstance(v, dict | list) else str(v)
        s = " ".join(s.split()) if "\n" in s else s
        return s if len(s) <= max_width else s[: max_width - 3] + "..."

    cells = [[text(v) for v in r] for r in result.rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(result.columns)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.append(f"({len(cells)} row{'' if len(cells) == 1 else 's'})")
    return "\n".join(lines)


@click.command("sql")
@click.argument("statement", required=False)
@click.option("--file", "file", type=click.Path(dir_okay=False, path_type=Path), help="Read the statement from F.sql.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@click.option("--max-width", default=60, show_default=True, type=click.IntRange(8), help="Table cells cut at this.")
def command(statement: str | None, file: Path | None, fmt: str, max_width: int) -> None:
    """Run one read-only SQL STATEMENT (or --file F.sql) against the store and print the rows.

    \b
    Views: pool_current, experience_history, run_rewards, experience_usage.
    Recipes: sql/recipes/*.sql, e.g. lanpo sql --file sql/recipes/best_experiences_by_lift.sql
    Writes are refused (READ ONLY transaction) and change nothing.
    """
    if (statement is None) == (file is None):
        raise InputError("give either a STATEMENT or --file F.sql", hint='lanpo sql "SELECT count(*) FROM problems"')
    if file is not None:
        if not file.exists():
            raise InputError(f"{file} does not exist")
        statement = file.read_text()
    result = query_readonly(connect(), statement or "")
    click.echo(format_result(result, fmt, max_width))
