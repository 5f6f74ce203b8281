"""Hand-written SQL kept in `sql/`: one statement per file, named `:params`, loaded once and cached.

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
def text_of(name: str) -> str:
    """The text of `sql/<name>.sql` (name like `queries/sample_intra`)."""
    path = sql_dir() / f"{name}.sql"
    return path.read_text()


@cache
def load(name: str) -> sa.TextClause:
    """`sql/<name>.sql` as a TextClause with its `:named` parameters."""
    return sa.text(text_of(name))


def names(folder: str) -> list[str]:
    """Every `<folder>/<stem>` under sql/ (e.g. all recipes), sorted."""
    return sorted(f"{folder}/{p.stem}" for p in (sql_dir() / folder).glob("*.sql"))
