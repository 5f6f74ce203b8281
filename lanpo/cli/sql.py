"""`lanpo sql`: query the store as its read-only role and print a table, CSV or JSON.

The statement runs through `lanpo.db.readonly.query_readonly` (read-only role, READ ONLY transaction, one
statement, timeout, row cap); this module reads the options and formats the rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from pathlib import Path
from typing import Any

import click

from lanpo.db.engine import connect
from lanpo.db.readonly import QueryResult, SqlLimits, query_readonly
from lanpo.errors import InputError

ENV_TIMEOUT = "LANPO_SQL_TIMEOUT"


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
    if not result.columns:  # a command that returns no rows (SET, RESET, ...)
        return {"json": "[]", "csv": ""}.get(fmt, "(0 rows)")
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
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    envvar=ENV_TIMEOUT,
    help=f"Cancel the statement after this many seconds (default {SqlLimits.timeout_s:g}; env {ENV_TIMEOUT}).",
)
@click.option("--max-rows", type=int, help=f"Print at most N rows (default {SqlLimits.max_rows}; 0: all).")
def command(
    statement: str | None, file: Path | None, fmt: str, max_width: int, timeout_s: float | None, max_rows: int | None
) -> None:
    """Run one read-only SQL STATEMENT (or --file F.sql) against the store and print the rows.

    \b
    Views: pool_current, experience_history, run_rewards, experience_usage.
    Recipes: sql/recipes/*.sql, e.g. lanpo sql --file sql/recipes/best_experiences_by_lift.sql
    It runs as the store's read-only role (SELECT on lanpo's tables and views, nothing else) in a READ ONLY
    transaction: anything else is refused and changes nothing.
    """
    if (statement is None) == (file is None):
        raise InputError("give either a STATEMENT or --file F.sql", hint='lanpo sql "SELECT count(*) FROM problems"')
    source = "the statement"
    if file is not None:
        if not file.exists():
            raise InputError(f"{file} does not exist")
        statement, source = file.read_text(), str(file)
    given = {"timeout_s": timeout_s, "max_rows": max_rows}
    limits = SqlLimits(**{k: v for k, v in given.items() if v is not None})
    result = query_readonly(connect(), statement or "", limits, source)
    click.echo(format_result(result, fmt, max_width))
    if result.truncated:
        note = f"showing the first {len(result.rows)} rows; the query returned more (use LIMIT or --max-rows)"
        click.echo(note, err=fmt != "table")
