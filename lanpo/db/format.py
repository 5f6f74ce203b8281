"""Query results as text: an aligned table, CSV or JSON (`lanpo sql`, the demo's tour of the views)."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from typing import Any

from lanpo.db.readonly import QueryResult


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
