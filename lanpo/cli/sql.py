"""`lanpo sql`: query the store as its read-only role and print a table, CSV or JSON.

The statement runs through `lanpo.db.readonly.query_readonly` (read-only role, READ ONLY transaction, one
statement, timeout, row cap); this module reads the options; `lanpo.db.format` formats the rows.
"""

from __future__ import annotations

from pathlib import Path

import click

from lanpo.db.connection import connect
from lanpo.db.format import format_result
from lanpo.db.readonly import SqlLimits, query_readonly
from lanpo.errors import InputError

ENV_TIMEOUT = "LANPO_SQL_TIMEOUT"


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
