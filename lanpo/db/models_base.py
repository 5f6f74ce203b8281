"""The declarative base of lanpo's tables and the check-constraint helpers every table module uses
(`lanpo.db.models`, `lanpo.db.models_serving`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# a scope (a user, an agent) of `lanpo serve`'s lessons and answers (migration 0022; `lanpo.serve.scopes` checks the
# same before a request is served)
SCOPE_VALID = "scope IS NULL OR scope ~ '^[A-Za-z0-9._:@-]{1,128}$'"


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _nonempty(column: str) -> str:
    return f"length(btrim({column})) > 0"


def _finite(column: str) -> str:
    return f"{column} IS NULL OR {column} NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


def _nonnegative_finite(column: str) -> str:
    return f"{column} >= 0 AND {column} < 'Infinity'"  # Postgres orders NaN above Infinity: NaN fails too


def _unset_or(column: str, low: str, high: str) -> str:
    """NULL, or within the bounds: `_unset_or("x", "> 0", "<= 1")`."""
    return f"{column} IS NULL OR {column} {low} AND {column} {high}"
