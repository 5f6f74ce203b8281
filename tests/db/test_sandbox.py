"""User SQL is sandboxed: every attack of issue 8 fails AND changes nothing.

Each statement runs through `query_readonly` (what `lanpo sql`, `--file` and the demo use) as the read-only
role. After each one the test compares a snapshot of the store (row counts, sequences, large objects,
extensions, relations, the reader's attributes, settings, memberships and grants) and checks the side
effect the attack was after: a marker file, a written file, another session.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import fill_history, snapshot

from lanpo.db.models import Base
from lanpo.db.reader import reader_login, stored_reader
from lanpo.db.readonly import SqlLimits, query_readonly
from lanpo.errors import InputError

REFUSED = r"^refused: [^\n]*; nothing was changed\n  hint: "  # one line saying what, then a hint


@pytest.fixture
def filled(db: Engine, session: Session) -> Engine:
    fill_history(session)
    session.commit()
    return db


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder the server's OS user could write to: a refused write is refused by Postgres, not by the OS."""
    folder = Path(tempfile.mkdtemp(prefix="lanpo-sandbox-"))
    folder.chmod(0o777)
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def refused(db: Engine, statement: str, match: str = REFUSED) -> None:
    """The statement is refused, and the store is as it was."""
    before = snapshot(db)
    with pytest.raises(InputError, match=match):
        query_readonly(db, statement)
    assert snapshot(db) == before


def would_write(db: Engine, statement: str, path: Path) -> None:
    """Control: run as the owner, the statement does write `path`, so its absence after the reader is telling.

    Only where the owner is a superuser on this machine (a socket server, such as the embedded one).
    """
    with db.connect() as conn:
        if not conn.scalar(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")):
            return
        if not str(db.url.query.get("host", "")).startswith("/"):
            return
        conn.execute(sa.text(statement))
        conn.rollback()
    assert path.exists()
    path.unlink()


def test_copy_to_program_runs_nothing(filled: Engine, open_dir: Path) -> None:
    marker = open_dir / "pwned"
    statement = f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'"
    would_write(filled, statement, marker)
    refused(filled, statement)
    assert not marker.exists()


def test_copy_to_and_from_server_files(filled: Engine, open_dir: Path) -> None:
    target = open_dir / "problems.csv"
    statement = f"COPY problems TO '{target}'"
    would_write(filled, statement, target)
    refused(filled, statement)
    refused(filled, "COPY problems FROM '/etc/hostname'")
    assert not target.exists()


def test_large_objects_and_server_files(filled: Engine, open_dir: Path) -> None:
    target = open_dir / "lo"
    for statement in (
        "SELECT lo_import('/etc/hostname')",
        f"SELECT lo_export(1234, '{target}')",
        "SELECT lo_from_bytea(0, 'x')",
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT pg_read_binary_file('/etc/passwd')",
        "SELECT pg_ls_dir('.')",
        "SELECT pg_stat_file('/etc/passwd')",
    ):
        refused(filled, statement)
    assert not target.exists()


def test_cannot_signal_the_trainer(filled: Engine) -> None:
    """The trainer's sessions belong to another role: Postgres refuses to signal them, revoke or not."""
    with filled.connect() as trainer:
        pid = trainer.scalar(sa.text("SELECT pg_backend_pid()"))
        for function in ("pg_terminate_backend", "pg_cancel_backend"):
            refused(filled, f"SELECT {function}({pid})")
        assert trainer.scalar(sa.text("SELECT 1")) == 1


def revoked_from_public(db: Engine) -> bool:
    """Whether migration 0004 could revoke the session functions from PUBLIC (it needs a superuser)."""
    with db.connect() as conn:
        return not conn.scalar(
            sa.text("SELECT has_function_privilege('public', 'pg_cancel_backend(integer)', 'EXECUTE')")
        )


def test_cannot_signal_another_reader(filled: Engine) -> None:
    if not revoked_from_public(filled):
        pytest.skip("the migration's user is not a superuser: the revoke is left to an administrator")
    with reader_login(filled).connect() as other_reader:
        pid = other_reader.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        for function in ("pg_terminate_backend", "pg_cancel_backend"):
            refused(filled, f"SELECT {function}({pid})")
        refused(filled, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
        assert other_reader.execute("SELECT 1").fetchone() == (1,)


def test_advisory_locks_are_the_trainers(filled: Engine) -> None:
    if not revoked_from_public(filled):
        pytest.skip("the migration's user is not a superuser: the revoke is left to an administrator")
    # The global capacity cap serialises writers on pg_advisory_xact_lock(hashtext('lanpo:global_cap')).
    refused(filled, "SELECT pg_advisory_lock(hashtext('lanpo:global_cap'))")
    refused(filled, "SELECT pg_try_advisory_xact_lock(1)")


def test_no_way_back_to_a_privileged_role(filled: Engine) -> None:
    with filled.connect() as conn:
        owner = conn.scalar(sa.text("SELECT current_user"))
        bootstrap_superuser = conn.scalar(sa.text("SELECT rolname FROM pg_roles WHERE oid = 10"))
    role = stored_reader(filled).role
    refused(filled, f'SET ROLE "{owner}"')
    refused(filled, f'SET ROLE "{bootstrap_superuser}"')
    refused(filled, f'SET SESSION AUTHORIZATION "{owner}"')
    refused(filled, f"SELECT set_config('role', '{owner}', false)")
    refused(filled, f"SELECT set_config('session_authorization', '{owner}', false)")
    # RESET ROLE goes back to the session user, which is the reader itself: it runs and gains nothing.
    before = snapshot(filled)
    assert query_readonly(filled, "RESET ROLE").rows == []
    back = query_readonly(filled, "SELECT set_config('role', 'none', false), current_user, session_user")
    assert back.rows == [("none", role, role)]
    assert snapshot(filled) == before


def test_read_only_cannot_be_switched_off(filled: Engine) -> None:
    before = snapshot(filled)
    turned = query_readonly(
        filled,
        "SELECT set_config('default_transaction_read_only', 'off', false), current_setting('transaction_read_only')",
    )
    assert turned.rows == [("off", "on")]  # the session default moved; this transaction stays read-only
    assert snapshot(filled) == before
    with pytest.raises(InputError, match="read-write mode"):
        query_readonly(filled, "SELECT set_config('transaction_read_only', 'off', false)")
    refused(filled, "DELETE FROM attempts")
    assert snapshot(filled) == before


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM attempts",
        "WITH d AS (DELETE FROM attempts RETURNING id) SELECT count(*) FROM d",
        "WITH u AS (UPDATE runs SET status = 'failed' RETURNING id) SELECT * FROM u",
        "TRUNCATE problems CASCADE",
        "SELECT * FROM problems FOR UPDATE",
        "SELECT nextval('problems_id_seq')",
        "SELECT setval('problems_id_seq', 1000)",
        "DO $$ BEGIN DELETE FROM problems; END $$",
        "DO $$ BEGIN EXECUTE 'CREATE TABLE sneaky (x int)'; END $$",
        "CREATE TABLE sneaky (x int)",
        "CREATE TEMP TABLE sneaky (x int)",
        "CREATE FUNCTION sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE EXTENSION IF NOT EXISTS plpgsql",
        "CREATE EXTENSION dblink",
        "DROP EXTENSION vector CASCADE",
        "LOAD '/tmp/evil.so'",
        "LOAD 'plpgsql'",
        "SELECT * FROM lanpo_private.reader_login",
        "SELECT * FROM pg_authid",
        "ALTER ROLE CURRENT_USER SET default_transaction_read_only = off",
        "ALTER ROLE CURRENT_USER SUPERUSER",
        "ALTER ROLE CURRENT_USER PASSWORD 'mine now'",
        "GRANT pg_execute_server_program TO CURRENT_USER",
        "GRANT SELECT ON lanpo_private.reader_login TO PUBLIC",
        "GRANT INSERT ON problems TO PUBLIC",
        "LOCK TABLE problems IN ACCESS EXCLUSIVE MODE",
        "SELECT pg_reload_conf()",
        "CHECKPOINT",
    ],
)
def test_writes_and_escalations_are_refused(filled: Engine, statement: str) -> None:
    refused(filled, statement)


def test_writes_hidden_in_functions(filled: Engine) -> None:
    """Functions the owner made that write, called by the reader: as invoker and as SECURITY DEFINER."""
    with filled.begin() as conn:
        for name, security in (("wipe_invoker", "INVOKER"), ("wipe_definer", "DEFINER")):
            conn.execute(
                sa.text(
                    f"CREATE FUNCTION {name}() RETURNS bigint LANGUAGE sql SECURITY {security} "
                    "AS 'WITH d AS (DELETE FROM attempts RETURNING 1) SELECT count(*) FROM d'"
                )
            )
    try:
        refused(filled, "SELECT wipe_invoker()")
        refused(filled, "SELECT wipe_definer()")  # runs as the owner, inside the reader's READ ONLY transaction
    finally:
        with filled.begin() as conn:
            conn.execute(sa.text("DROP FUNCTION wipe_invoker(), wipe_definer()"))


def test_one_statement_per_call(filled: Engine) -> None:
    before = snapshot(filled)
    with pytest.raises(InputError, match="one SQL statement"):
        query_readonly(filled, "SELECT 1; COMMIT; DELETE FROM problems")
    assert snapshot(filled) == before


@pytest.mark.parametrize(
    "statement", ["SELECT pg_sleep(5)", "SELECT set_config('statement_timeout', '0', true), pg_sleep(5)"]
)
def test_a_query_past_the_timeout_is_cancelled(filled: Engine, statement: str) -> None:
    before = snapshot(filled)
    started = time.perf_counter()
    with pytest.raises(InputError, match=r"ran past 0.5 s and was cancelled; nothing was changed"):
        query_readonly(filled, statement, SqlLimits(timeout_s=0.5))
    assert time.perf_counter() - started < 4
    assert snapshot(filled) == before


def test_the_reader_reads_every_table_and_view(filled: Engine) -> None:
    with filled.connect() as conn:
        names = [t.name for t in Base.metadata.sorted_tables] + sa.inspect(conn).get_view_names()
    assert {"pool_current", "experience_history", "run_rewards", "experience_usage"} <= set(names)
    for name in [*names, "alembic_version"]:
        assert query_readonly(filled, f"SELECT count(*) FROM {name}").rows, name


def test_row_cap_says_it_truncated(filled: Engine) -> None:
    capped = query_readonly(filled, "SELECT generate_series(1, 100000000) AS n", SqlLimits(max_rows=5))
    assert capped.rows == [(1,), (2,), (3,), (4,), (5,)] and capped.truncated
    exact = query_readonly(filled, "SELECT generate_series(1, 5) AS n", SqlLimits(max_rows=5))
    assert len(exact.rows) == 5 and not exact.truncated
    every = query_readonly(filled, "SELECT generate_series(1, 2000) AS n", SqlLimits(max_rows=0))
    assert len(every.rows) == 2000 and not every.truncated


def test_only_comments_is_an_error(filled: Engine) -> None:
    with pytest.raises(InputError, match=r"no SQL statement in q\.sql: only comments"):
        query_readonly(filled, "-- nothing here\n/* nor here */\n", source="q.sql")
    with pytest.raises(InputError, match="no SQL statement in the statement: it is empty"):
        query_readonly(filled, "  \n ")


def test_runs_through_the_database_url(filled: Engine, db_env: str) -> None:
    """The fixtures hand lanpo the test database through LANPO_DATABASE_URL: the reader is that server's."""
    assert os.environ["LANPO_DATABASE_URL"] == db_env
    role = stored_reader(filled).role
    assert query_readonly(filled, "SELECT current_user, current_database()").rows == [(role, filled.url.database)]
