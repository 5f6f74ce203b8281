"""The schema: migrations match the models, round-trip, and the constraints hold."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine

from lanpo.db import migrate
from lanpo.db.connection import current_revision, require_migrated
from lanpo.db.models import Base
from lanpo.db.reader import stored_reader
from lanpo.db.readonly import query_readonly
from lanpo.errors import NotMigrated


def _diff(db: Engine) -> list:
    with db.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(ctx, Base.metadata)


def test_models_and_migrations_do_not_drift(db: Engine) -> None:
    assert _diff(db) == []


def test_vector_extension_and_hnsw_indexes(db: Engine) -> None:
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
        methods = dict(
            conn.execute(
                sa.text(
                    "SELECT c.relname, am.amname FROM pg_class c JOIN pg_am am ON am.oid = c.relam "
                    "WHERE c.relname LIKE '%embedding_hnsw'"
                )
            ).all()
        )
    assert methods == {"ix_problems_embedding_hnsw": "hnsw", "ix_experience_versions_embedding_hnsw": "hnsw"}


def _fill(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO problems (dataset, external_id, question, answer) VALUES ('d', '1', 'q', 'a')")
        )
        conn.execute(
            sa.text("INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('p', 4, 2, 'oldest')")
        )
        conn.execute(sa.text("INSERT INTO experiences (pool_id, problem_id, reward) VALUES (1, 1, 1.0)"))
        conn.execute(sa.text("INSERT INTO experience_versions (experience_id, version, summary) VALUES (1, 1, 's')"))
        conn.execute(sa.text("INSERT INTO rollout_groups (problem_id, mode, prompt) VALUES (1, 'zero_shot', 'p')"))
        conn.execute(sa.text("INSERT INTO attempts (group_id, response, reward) VALUES (1, 'r', 1.0)"))


def _reader_state(db: Engine) -> tuple[bool, bool, bool]:
    """(the reader role exists, lanpo_private exists, PUBLIC may run pg_cancel_backend in this database)."""
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'lanpo_reader_' || current_database()), "
                "EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'lanpo_private'), "
                "has_function_privilege('public', 'pg_cancel_backend(integer)', 'EXECUTE')"
            )
        ).one()


def _superuser(db: Engine) -> bool:
    with db.connect() as conn:
        return conn.scalar(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))


def test_upgrade_downgrade_upgrade_empty_and_filled(db: Engine) -> None:
    migrate.downgrade(db, "base")
    assert current_revision(db) is None
    assert tuple(_reader_state(db))[:2] == (False, False)
    migrate.upgrade(db)
    _fill(db)
    migrate.downgrade(db, "base")
    with db.connect() as conn:
        assert not sa.inspect(conn).has_table("experiences")
    migrate.upgrade(db)
    assert current_revision(db) == migrate.head_revision()
    assert _diff(db) == []
    assert query_readonly(db, "SELECT count(*) FROM pool_current").rows == [(0,)]


def test_reader_role_round_trip(db: Engine) -> None:
    """0004 down drops the role, its login and the revokes; up again makes a fresh role with a new password."""
    superuser = _superuser(db)
    assert _reader_state(db) == (True, True, not superuser)
    _fill(db)
    password = stored_reader(db).password
    migrate.downgrade(db, "0003")
    assert _reader_state(db) == (False, False, True)
    assert current_revision(db) == "0003"
    migrate.upgrade(db)
    assert _reader_state(db) == (True, True, not superuser)
    assert stored_reader(db).password != password
    assert query_readonly(db, "SELECT count(*) FROM experiences").rows == [(1,)]


def test_not_migrated_names_the_command(db: Engine) -> None:
    migrate.downgrade(db, "base")
    try:
        with pytest.raises(NotMigrated, match="lanpo db upgrade"):
            require_migrated(db)
    finally:
        migrate.upgrade(db)


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO problems (dataset, external_id, question) VALUES ('d', 'x', '   ')",
        "INSERT INTO attempts (group_id, response, reward) VALUES (1, 'r', 'NaN')",
        "INSERT INTO attempts (group_id, response, served_adapter_sha256) VALUES (1, 'r', 'not-a-sha')",
        "INSERT INTO rollout_groups (problem_id, mode, prompt) VALUES (1, 'telepathy', 'p')",
        "INSERT INTO attempts (group_id, response) VALUES (999, 'r')",
        "INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('q', 0, 1, 'oldest')",
        "INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('q', 1, 1, 'randomly')",
        "INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('p', 1, 1, 'oldest')",
        "INSERT INTO experiences (problem_id) VALUES (1)",
        "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (1, 1, 's', 0.5)",
        "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (1, 2, 's', 1.5)",
        "INSERT INTO experience_versions (experience_id, version, summary) VALUES (1, 0, 's')",
    ],
)
def test_check_constraints(db: Engine, statement: str) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO problems (dataset, external_id, question) VALUES ('d', '1', 'q'), ('d', '2', 'q')")
        )
        conn.execute(
            sa.text("INSERT INTO pools (name, per_problem_cap, per_step_cap, eviction) VALUES ('p', 4, 2, 'oldest')")
        )
        conn.execute(sa.text("INSERT INTO experiences (pool_id, problem_id) VALUES (1, 1)"))
        conn.execute(sa.text("INSERT INTO rollout_groups (problem_id, mode, prompt) VALUES (1, 'zero_shot', 'p')"))
    with pytest.raises(sa.exc.IntegrityError), db.begin() as conn:
        conn.execute(sa.text(statement))


def test_experience_versions_are_immutable_but_embedding_fills_once(db: Engine) -> None:
    _fill(db)
    vec = "[" + ",".join(["0.1"] * 384) + "]"
    with db.begin() as conn:
        conn.execute(sa.text("UPDATE experience_versions SET embedding = CAST(:v AS vector) WHERE id = 1"), {"v": vec})
    with pytest.raises(sa.exc.DBAPIError, match="immutable"), db.begin() as conn:
        conn.execute(sa.text("UPDATE experience_versions SET summary = 'rewritten' WHERE id = 1"))
    with pytest.raises(sa.exc.DBAPIError, match="immutable"), db.begin() as conn:
        conn.execute(sa.text("UPDATE experience_versions SET embedding = NULL WHERE id = 1"))
