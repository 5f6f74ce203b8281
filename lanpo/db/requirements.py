"""What lanpo needs of a server, checked before any migration runs and by `lanpo db status`.

- PostgreSQL 14 or newer: migration 0003 sets lz4 TOAST compression (`ALTER COLUMN ... SET COMPRESSION`, new in 14).
- pgvector 0.8.0 or newer: filtered HNSW searches set `hnsw.iterative_scan` (pgvector's CHANGELOG, 0.8.0: "Added
  support for iterative index scans"). On 0.7.4 the setting is refused ("hnsw" is a reserved prefix) once the
  library is loaded in a session, and before that it becomes a placeholder that silently drops the iterative scan.

Tested: the embedded PostgreSQL 18.4 with pgvector 0.8.5, and PostgreSQL 15.18 with pgvector 0.8.1 and 0.7.4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa

from lanpo.errors import InputError

POSTGRES_NEEDED = 14
PGVECTOR_NEEDED = (0, 8, 0)
INSTALL_URL = "https://github.com/pgvector/pgvector#installation"


@dataclass(frozen=True)
class ServerFacts:
    postgres: str  # server_version, e.g. "18.4"
    postgres_num: int  # server_version_num, e.g. 180004
    installed: str | None  # pgvector's version in this database (None: not created here)
    available: str | None  # the version the server's extension files would create (None: not installed there)
    database: str
    user: str
    superuser: bool


def version_tuple(version: str) -> tuple[int, ...]:
    """`"0.8.1"` -> (0, 8, 1); whatever follows the number (`"0.8.0-dev"`, `"15.18 (Debian ...)"`) is ignored."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def server_facts(conn: sa.Connection) -> ServerFacts:
    row = conn.execute(
        sa.text(
            "SELECT current_setting('server_version') AS postgres, "
            "current_setting('server_version_num')::int AS postgres_num, "
            "(SELECT extversion FROM pg_extension WHERE extname = 'vector') AS installed, "
            "(SELECT default_version FROM pg_available_extensions WHERE name = 'vector') AS available, "
            "current_database() AS database, current_user AS user, "
            "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser"
        )
    ).one()
    return ServerFacts(**row._mapping)


def check_postgres(facts: ServerFacts) -> None:
    if facts.postgres_num < POSTGRES_NEEDED * 10000:
        raise InputError(
            f"this server runs PostgreSQL {facts.postgres}; lanpo needs {POSTGRES_NEEDED} or newer",
            hint="point LANPO_DATABASE_URL at a newer server, or unset it to use the embedded PostgreSQL 18",
        )


def check_pgvector(facts: ServerFacts, outcome: str = "nothing was migrated") -> None:
    """Refuse an installed pgvector older than lanpo needs, with the SQL that upgrades it."""
    if facts.installed is None or version_tuple(facts.installed) >= PGVECTOR_NEEDED:
        return
    needed = _dotted(PGVECTOR_NEEDED)
    newer_files = facts.available is not None and version_tuple(facts.available) >= PGVECTOR_NEEDED
    files = (
        f"the server's files are {facts.available}: run"
        if newer_files
        else f"install pgvector {needed} or newer on the server ({INSTALL_URL}) and run"
    )
    raise InputError(
        f'pgvector {facts.installed} is installed in database "{facts.database}"; lanpo needs {needed} or newer '
        f"(its filtered HNSW searches use hnsw.iterative_scan, new in 0.8.0); {outcome}",
        hint=f"{files} this as its owner or a superuser; then `lanpo db upgrade`",
        detail="ALTER EXTENSION vector UPDATE;",
    )


def ensure_pgvector(conn: sa.Connection) -> None:
    """Before a migration: the server is new enough, and pgvector is installed here, recent, or can be created.

    Creating it needs a superuser (pgvector is not a trusted extension); a user that may not is told the SQL an
    administrator runs, as for the read-only role.
    """
    facts = server_facts(conn)
    check_postgres(facts)
    check_pgvector(facts)
    if facts.installed is not None:
        return
    needed = _dotted(PGVECTOR_NEEDED)
    if facts.available is None or version_tuple(facts.available) < PGVECTOR_NEEDED:
        found = "has no pgvector" if facts.available is None else f"has pgvector {facts.available}"
        raise InputError(
            f"the server {found}; lanpo needs the extension vector {needed} or newer; nothing was migrated",
            hint=f"install pgvector {needed} or newer on the server ({INSTALL_URL}), then `lanpo db upgrade` again",
        )
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa.exc.DBAPIError as exc:
        raise InputError(
            f'user {facts.user} may not create the extension vector in database "{facts.database}" '
            f"({str(getattr(exc, 'orig', exc)).strip().splitlines()[0]}); nothing was migrated",
            hint=f'an administrator (a superuser) runs this in database "{facts.database}"; then `lanpo db upgrade`',
            detail="CREATE EXTENSION vector;",
        ) from exc


def describe(facts: ServerFacts) -> str:
    """One line for `lanpo db status`."""
    vector = f"pgvector {facts.installed}" if facts.installed else "pgvector not created yet (`lanpo db upgrade` does)"
    needs = f"lanpo needs PostgreSQL >= {POSTGRES_NEEDED}, pgvector >= {_dotted(PGVECTOR_NEEDED)}"
    return f"PostgreSQL {facts.postgres.split()[0]}, {vector} ({needs})"
