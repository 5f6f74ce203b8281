"""What lanpo needs of a server (lanpo.db.requirements): PostgreSQL >= 14 and pgvector >= 0.8.0, checked before any
migration and by `lanpo db status`, with the SQL that fixes what is missing. Measured beside these tests on
PostgreSQL 15.18 with pgvector 0.7.4 (refused, `ALTER EXTENSION vector UPDATE` once 0.8.1's files were installed)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from lanpo.db import requirements
from lanpo.db.requirements import PGVECTOR_NEEDED, ServerFacts, check_pgvector, check_postgres, version_tuple
from lanpo.errors import HINT_LIMIT, InputError

FACTS = ServerFacts("15.18 (Debian 15.18-0+deb12u1)", 150018, "0.8.1", "0.8.1", "lanpo", "owner", True)


def test_versions_compare_as_numbers() -> None:
    assert version_tuple("0.8.1") == (0, 8, 1)
    assert version_tuple("0.10.0") > version_tuple("0.8.0")  # "0.10.0" < "0.8.0" as text
    assert version_tuple("0.8.0-dev") == (0, 8, 0) and version_tuple("18.4 (Debian)") == (18, 4)
    assert version_tuple("beta") == ()


def test_pgvector_older_than_0_8_is_refused_with_the_sql_that_upgrades_it() -> None:
    check_pgvector(FACTS)
    check_pgvector(replace(FACTS, installed="0.8.0"))
    check_pgvector(replace(FACTS, installed="0.10.2"))
    with pytest.raises(InputError) as old_files:
        check_pgvector(replace(FACTS, installed="0.7.4", available="0.7.4"))
    assert old_files.value.message == (
        'pgvector 0.7.4 is installed in database "lanpo"; lanpo needs 0.8.0 or newer (its filtered HNSW searches use '
        "hnsw.iterative_scan, new in 0.8.0); nothing was migrated"
    )
    assert old_files.value.hint.startswith("install pgvector 0.8.0 or newer on the server")
    assert len(old_files.value.hint) < HINT_LIMIT and old_files.value.detail == "ALTER EXTENSION vector UPDATE;"
    assert "\n    ALTER EXTENSION vector UPDATE;" in str(old_files.value)  # under the hint, as printed
    with pytest.raises(InputError) as new_files:
        check_pgvector(replace(FACTS, installed="0.7.4", available="0.8.1"))
    assert new_files.value.hint.startswith("the server's files are 0.8.1: run")


def test_postgres_older_than_14_is_refused() -> None:
    check_postgres(replace(FACTS, postgres="14.0", postgres_num=140000))
    with pytest.raises(InputError, match=r"PostgreSQL 13\.9; lanpo needs 14 or newer"):
        check_postgres(replace(FACTS, postgres="13.9", postgres_num=130009))


def test_the_test_server_meets_them(db: Engine, run_cli: Callable) -> None:
    with db.connect() as conn:
        facts = requirements.server_facts(conn)
    assert version_tuple(facts.installed or "") >= PGVECTOR_NEEDED and facts.postgres_num >= 140000
    status = run_cli("db", "status")
    assert status.code == 0 and f"pgvector {facts.installed} (lanpo needs PostgreSQL >= 14, pgvector >= 0.8.0)" in (
        status.out
    )


def test_upgrade_and_status_refuse_before_any_ddl(
    db: Engine, pg_url: str, run_cli: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bar above the server's pgvector, a fresh database gets no schema at all, and status says why."""
    with db.connect() as conn:
        if not conn.scalar(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")):
            pytest.skip("the test server's user is not a superuser")
        installed = requirements.server_facts(conn).installed
    monkeypatch.setattr(requirements, "PGVECTOR_NEEDED", (99, 0, 0))
    status = run_cli("db", "status")
    assert status.code == 2 and f"error: pgvector {installed} is installed" in status.err
    assert "lanpo refuses to migrate it" in status.err and "ALTER EXTENSION vector UPDATE" in status.err

    fresh = f"lanpo_req_{secrets.token_hex(4)}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{fresh}"'))
    url = make_url(pg_url).set(database=fresh)
    try:
        monkeypatch.setenv("LANPO_DATABASE_URL", url.render_as_string(hide_password=False))
        up = run_cli("db", "upgrade")
        assert up.code == 2 and up.out == "" and "lanpo needs the extension vector 99.0.0 or newer" in up.err
        there = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with there.connect() as conn:
            assert not sa.inspect(conn).has_table("alembic_version")
            assert conn.scalar(sa.text("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")) == 0
        there.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{fresh}" WITH (FORCE)'))
        admin.dispose()
