"""Connecting to the store: `LANPO_DATABASE_URL`, else the embedded server under `$LANPO_HOME`.

`connect()` returns an Engine after checking the server answers and the schema is at the head
revision, so every command fails early with a message that names the fix. `open_store()` is the same for the
Python API (`lanpo.feedback`), except that a fresh store, an empty database, is migrated first, as the demo does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from lanpo.config import lanpo_home
from lanpo.db import server
from lanpo.errors import ConfigError, DatabaseUnavailable, NotMigrated

ENV_URL = "LANPO_DATABASE_URL"
URL_SHAPE = "postgresql://user:pass@host:5432/dbname"


def normalise_url(url: str) -> str:
    """Accept `postgres://` and `postgresql://` URLs and use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _masked(url: str) -> str:
    """`url` with any password replaced by ***, for error messages (it may not parse, so by its parts)."""
    scheme, sep, rest = url.partition("://")
    prefix, rest = (scheme + sep, rest) if sep else ("", url)
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{prefix}{userinfo.split(':', 1)[0]}:***@{host}"


def checked_url(url: str, source: str = ENV_URL) -> str:
    """`url` normalised (psycopg 3 driver), or ConfigError saying what a Postgres URL looks like."""
    normal = normalise_url(url.strip())
    try:
        parsed = make_url(normal)
        port = parsed.port  # an unparsable port fails here (ValueError)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"{source} {_masked(url)!r} is not a database URL", hint=f"it looks like {URL_SHAPE}"
        ) from exc
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            f"{source} {_masked(url)!r} is not a Postgres URL ({parsed.get_backend_name()})",
            hint=f"lanpo needs Postgres with pgvector: {URL_SHAPE}",
        )
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(
            f"{source} {_masked(url)!r}: port {port} is not in 1..65535", hint=f"it looks like {URL_SHAPE}"
        )
    return normal


def database_url(start_embedded: bool = True) -> str:
    """The URL lanpo uses: `$LANPO_DATABASE_URL`, or the embedded server (started on demand)."""
    url = os.environ.get(ENV_URL)
    if url and url.strip():
        return checked_url(url)
    if not start_embedded:
        raise DatabaseUnavailable("no LANPO_DATABASE_URL and the embedded server was not started")
    return server.start(lanpo_home())


def is_embedded() -> bool:
    return not os.environ.get(ENV_URL, "").strip()


def make_db(url: str | None = None, **kwargs: object) -> Engine:
    """An Engine for `url` (default: `database_url()`), verified to answer."""
    url = url or database_url()
    db = sa.create_engine(url, pool_pre_ping=True, **kwargs)  # type: ignore[arg-type]
    try:
        with db.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        db.dispose()
        where = db.url.render_as_string(hide_password=True)
        why = " ".join(str(exc.orig).split())  # libpq's message spans lines; the error is one
        raise DatabaseUnavailable(
            f"cannot reach the database at {where}: {why}",
            hint="start it, check LANPO_DATABASE_URL, or unset it to use the embedded server (`lanpo db start`)",
        ) from exc
    return db


def current_revision(db: Engine) -> str | None:
    """The Alembic revision the database is at (None: never migrated)."""
    with db.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        return conn.scalar(sa.text("SELECT version_num FROM alembic_version"))


def has_reader_setup(db: Engine) -> bool:
    """Whether migration 0004 (the read-only role's login in `lanpo_private`) has run."""
    with db.connect() as conn:
        return sa.inspect(conn).has_table("reader_login", schema="lanpo_private")


def has_serve_setup(db: Engine) -> bool:
    """Whether migration 0014 (the serving role's login in `lanpo_private`) has run."""
    with db.connect() as conn:
        return sa.inspect(conn).has_table("serve_login", schema="lanpo_private")


def require_migrated(db: Engine) -> None:
    """Raise NotMigrated unless the schema is at the head revision."""
    from lanpo.db.migrate import head_revision

    current = current_revision(db)
    head = head_revision()
    if current != head:
        state = "has no lanpo schema" if current is None else f"is at revision {current}, the code needs {head}"
        raise NotMigrated(f"the database {state}", hint="run `lanpo db upgrade`")


def connect(url: str | None = None, migrated: bool = True) -> Engine:
    """Engine for commands: reachable, and (unless `migrated=False`) at the head revision."""
    db = make_db(url)
    if migrated:
        require_migrated(db)
    return db


def open_store(url: str | None = None) -> Engine:
    """The store at `url` (default: `database_url()`), reachable and at the head revision; an empty database (no
    table at all: a fresh `LANPO_HOME`'s embedded server, or a new database on a server) is migrated first.

    Only an empty one: creating lanpo's schema there loses nothing and is what pointing lanpo at it asks for. A
    database at an older revision, or holding other tables, still gets NotMigrated ("run `lanpo db upgrade`"): an
    upgrade rewrites tables that runs, readers or another lanpo version may be using, so it stays a command its
    owner runs on purpose."""
    db = make_db(url)
    if current_revision(db) is None and _is_empty(db):
        from lanpo.db.migrate import upgrade

        upgrade(db)
    require_migrated(db)
    return db


def _is_empty(db: Engine) -> bool:
    """No table in any schema of the database but the server's own."""
    with db.connect() as conn:
        found = conn.scalar(
            sa.text(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
            )
        )
    return found == 0


def session_factory(db: Engine) -> sessionmaker[Session]:
    return sessionmaker(db, expire_on_commit=False)


@contextmanager
def transaction(db: Engine) -> Iterator[Session]:
    """One session in one transaction: committed on success, rolled back on any error."""
    with session_factory(db)() as session, session.begin():
        yield session
