"""Shared fixtures: a real Postgres + pgvector for the whole session, migrated once, each test isolated.

`LANPO_DATABASE_URL` set: a fresh database `lanpo_test_<random>` is created on that server and dropped
at the end, with its read-only role `lanpo_reader_lanpo_test_<random>`; the URL's user needs CREATEDB and
CREATEROLE (a superuser for the sandbox tests that make roles of their own). Otherwise an embedded server
is started in a temporary `LANPO_HOME`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from lanpo.db import migrate, server
from lanpo.db.engine import ENV_URL, make_engine, normalise_url
from lanpo.db.models import Base


@dataclass(frozen=True)
class PgServer:
    url: str  # an empty database reserved for this test session
    home: Path | None  # LANPO_HOME of the embedded server (None: the server of LANPO_DATABASE_URL)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = os.environ.get(ENV_URL)
    if external:
        admin = sa.create_engine(normalise_url(external), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        name = f"lanpo_test_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = make_url(normalise_url(external)).set(database=name).render_as_string(hide_password=False)
        yield PgServer(url, None)
        readers = reader_roles(url)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            for role in readers:  # roles are cluster-wide: the database's read-only role outlives it
                conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
        return
    # Not under pytest's basetemp: concurrent pytest sessions prune each other's basetemp folders.
    home = Path(tempfile.mkdtemp(prefix="lanpo-test-home-"))
    url = server.start(home)
    yield PgServer(url, home)
    server.stop(home)
    shutil.rmtree(home, ignore_errors=True)


def reader_roles(url: str) -> list[str]:
    """The read-only role migration 0004 recorded in the database at `url` (none before it ran)."""
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with eng.connect() as conn:
            if not sa.inspect(conn).has_table("reader_login", schema="lanpo_private"):
                return []
            return list(conn.scalars(sa.text("SELECT role_name FROM lanpo_private.reader_login")))
    finally:
        eng.dispose()


@pytest.fixture(scope="session")
def pg_url(pg_server: PgServer) -> str:
    """URL of an empty database reserved for this test session."""
    return pg_server.url


@pytest.fixture(scope="session")
def engine(pg_url: str) -> Iterator[Engine]:
    """The session's database, migrated to head once."""
    eng = make_engine(pg_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def truncate_all(eng: Engine) -> None:
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with eng.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def db(engine: Engine) -> Iterator[Engine]:
    """The migrated engine; every table is emptied after the test (so tests may commit freely)."""
    yield engine
    truncate_all(engine)


@pytest.fixture
def session(db: Engine) -> Iterator[Session]:
    """A session on the test database; whatever it commits is truncated after the test."""
    with Session(db, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def db_env(pg_url: str, db: Engine, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point lanpo (CLI, subprocesses) at the test database through LANPO_DATABASE_URL."""
    monkeypatch.setenv(ENV_URL, pg_url)
    return pg_url


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(db_env: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `lanpo ARGS...` in-process against the test database; returns exit code, stdout, stderr."""
    from lanpo.cli import main

    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
