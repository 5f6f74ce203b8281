"""Hand-written SQL kept in `sql/`: one statement per file, named `:params`, all read at the first use and cached.

`load("queries/sample_inter")` reads `sql/queries/sample_inter.sql` from a source checkout (or the copy
packed into the wheel as `lanpo/_data/sql`) and returns a SQLAlchemy `TextClause`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import sqlalchemy as sa

from lanpo.resources import project_dir


def sql_dir() -> Path:
    """`sql/` of a source checkout, or the copy packed into the wheel."""
    found = project_dir("sql", "queries")
    if found is None:
        raise FileNotFoundError("lanpo's sql/ folder is missing from this installation")
    return found


@cache
def _texts() -> dict[str, str]:
    """Every statement under sql/ by name, all read at the process's first use of any: a process runs the SQL of
    one moment, so a checkout edited or pulled under a running trainer cannot mix old and new statements (a replay
    run once failed at step 2 on a query first read after it had been edited)."""
    root = sql_dir()
    return {path.relative_to(root).with_suffix("").as_posix(): path.read_text() for path in root.rglob("*.sql")}


def text_of(name: str) -> str:
    """The text of `sql/<name>.sql` (name like `queries/sample_intra`), as it was at the process's first read."""
    try:
        return _texts()[name]
    except KeyError:
        raise FileNotFoundError(f"lanpo has no SQL file {name}.sql under {sql_dir()}") from None


@cache
def load(name: str) -> sa.TextClause:
    """`sql/<name>.sql` as a TextClause with its `:named` parameters."""
    return sa.text(text_of(name))


def names(folder: str) -> list[str]:
    """Every `<folder>/<stem>` under sql/ (e.g. all recipes), sorted."""
    return sorted(name for name in _texts() if name.rpartition("/")[0] == folder)
