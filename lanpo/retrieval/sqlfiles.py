"""The retrieval package's hand-written SQL: `sql/queries/retrieval_*.sql`, loaded through `lanpo.db.sqlfiles`."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from lanpo.db import sqlfiles


def query(name: str) -> sa.TextClause:
    """The statement in `sql/queries/<name>.sql`."""
    return sqlfiles.load(f"queries/{name}")


def vector_literal(values: Iterable[float]) -> str:
    """A vector in pgvector's text form `[x,y,...]`, for `CAST(:param AS vector)`."""
    return "[" + ",".join(repr(float(x)) for x in values) + "]"
