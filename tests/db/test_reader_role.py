"""Migration 0004's read-only role: its attributes and grants, later tables, the privilege check, one role
per database, and an owner that may not create roles (the administrator's SQL, then LANPO_READER_URL)."""

from __future__ import annotations

import importlib.util
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from lanpo.db import migrate
from lanpo.db.reader import (
    ENV_READER_URL,
    PRIVILEGED_ROLES,
    libpq_uri,
    reader_login,
    settings_drift,
    stored_reader,
)
from lanpo.db.readonly import query_readonly
from lanpo.errors import InputError, ReaderUnavailable

ROOT = Path(__file__).resolve().parents[2]


def _migration():
    spec = importlib.util.spec_from_file_location("m0004", ROOT / "migrations/versions/0004_reader_role.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _admin(url: str, database: str | None = None) -> Engine:
    target = make_url(url) if database is None else make_url(url).set(database=database)
    return sa.create_engine(target, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def _superuser(db: Engine) -> bool:
    with db.connect() as conn:
        return bool(conn.scalar(sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")))


def test_role_name_fits_and_stays_unique() -> None:
    role_name = _migration().role_name
    assert role_name("lanpo") == "lanpo_reader_lanpo"
    long_a, long_b = "x" * 60 + "a", "x" * 60 + "b"
    assert len(role_name(long_a).encode()) <= 63 and role_name(long_a) != role_name(long_b)
    assert len(role_name("é" * 40).encode()) <= 63


def test_the_role_reads_and_nothing_else(db: Engine) -> None:
    role = stored_reader(db).role
    with db.connect() as conn:
        assert role == _migration().role_name(conn.scalar(sa.text("SELECT current_database()")))
        attributes = conn.execute(
            sa.text(
                "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolinherit, rolreplication, rolbypassrls, "
                "rolconfig FROM pg_roles WHERE rolname = :r"
            ),
            {"r": role},
        ).one()
        assert tuple(attributes)[:7] == (True, False, False, False, False, False, False)
        assert sorted(attributes.rolconfig) == ["default_transaction_read_only=on", "statement_timeout=60s"]
        memberships = conn.scalar(
            sa.text("SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = :r"),
            {"r": role},
        )
        assert memberships == 0
        can = conn.execute(
            sa.text(
                "SELECT has_schema_privilege(:r, 'lanpo_private', 'USAGE') AS private_usage, "
                "has_schema_privilege(:r, 'public', 'CREATE') AS create_in_public, "
                "has_database_privilege(:r, current_database(), 'CREATE') AS create_schema, "
                "has_database_privilege(:r, current_database(), 'TEMPORARY') AS temporary, "
                "has_table_privilege(:r, 'problems', 'INSERT, UPDATE, DELETE, TRUNCATE') AS write, "
                "has_sequence_privilege(:r, 'problems_id_seq', 'USAGE, UPDATE') AS sequence, "
                "has_table_privilege(:r, 'pool_current', 'SELECT') AS read_view"
            ),
            {"r": role},
        ).one()
        assert can._asdict() == {
            "private_usage": False,
            "create_in_public": False,
            "create_schema": False,
            "temporary": False,
            "write": False,
            "sequence": False,
            "read_view": True,
        }
        if _superuser(db):  # a superuser migrated it, so the revoke on session functions ran
            for function in ("pg_terminate_backend(integer, bigint)", "pg_cancel_backend(integer)"):
                assert not conn.scalar(
                    sa.text(f"SELECT has_function_privilege(:r, '{function}', 'EXECUTE')"), {"r": role}
                )


def test_tables_created_later_are_readable_in_public_only(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE later_table (x int)"))
        conn.execute(sa.text("INSERT INTO later_table VALUES (7)"))
        conn.execute(sa.text("CREATE TABLE lanpo_private.later_secret (x int)"))
    try:
        assert query_readonly(db, "SELECT x FROM later_table").rows == [(7,)]
        with pytest.raises(InputError, match=r"refused: .*permission denied for schema lanpo_private"):
            query_readonly(db, "SELECT x FROM lanpo_private.later_secret")
    finally:
        with db.begin() as conn:
            conn.execute(sa.text("DROP TABLE later_table, lanpo_private.later_secret"))


@pytest.fixture
def plain_role(db: Engine, pg_url: str) -> Iterator[tuple[str, str]]:
    """A role of our own (name, password), dropped afterwards; needs a superuser to make and grant."""
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    name, password = f"lanpo_t_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    admin = _admin(pg_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
    yield name, password
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {name}"))
        conn.execute(sa.text(f"DROP ROLE {name}"))
    admin.dispose()


@pytest.mark.parametrize(
    "grant", ["pg_read_server_files", "pg_signal_backend", "OWNER", "ATTRIBUTE", "WRITE", "WRITER_ROLE"]
)
def test_a_privileged_reader_url_is_refused(
    db: Engine, pg_url: str, plain_role: tuple[str, str], monkeypatch: pytest.MonkeyPatch, grant: str
) -> None:
    name, password = plain_role
    with _admin(pg_url).connect() as conn:
        owner = conn.scalar(sa.text("SELECT current_user"))
        statement = {
            "OWNER": f'GRANT "{owner}" TO {name}',
            "ATTRIBUTE": f"ALTER ROLE {name} CREATEROLE",
            "WRITE": f"GRANT SELECT, INSERT ON problems TO {name}",
            # NOINHERIT hides the writer's grants from the role itself, but not from SET ROLE.
            "WRITER_ROLE": f"ALTER ROLE {name} NOINHERIT; CREATE ROLE {name}_w; GRANT DELETE ON attempts TO "
            f"{name}_w; GRANT {name}_w TO {name}",
        }.get(grant, f"GRANT {grant} TO {name}")
        conn.exec_driver_sql(statement)
    assert grant in PRIVILEGED_ROLES or grant in ("OWNER", "ATTRIBUTE", "WRITE", "WRITER_ROLE")
    monkeypatch.setenv(ENV_READER_URL, make_url(pg_url).set(username=name, password=password).render_as_string(False))
    try:
        with pytest.raises(
            ReaderUnavailable, match=rf"refused: the role {name} \(LANPO_READER_URL\).*nothing was run"
        ):
            query_readonly(db, "SELECT count(*) FROM problems")
    finally:
        if grant == "WRITER_ROLE":
            with _admin(pg_url).connect() as conn:
                conn.exec_driver_sql(f"DROP OWNED BY {name}_w; DROP ROLE {name}_w")


def test_a_plain_reader_url_is_used(
    db: Engine, pg_url: str, plain_role: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, password = plain_role
    with _admin(pg_url).connect() as conn:
        conn.execute(sa.text(f"GRANT SELECT ON problems TO {name}"))
    login = make_url(pg_url).set(username=name, password=password)
    monkeypatch.setenv(ENV_READER_URL, login.update_query_dict({"application_name": "mine"}).render_as_string(False))
    assert query_readonly(db, "SELECT current_user, current_setting('application_name')").rows == [(name, "mine")]
    monkeypatch.setenv(ENV_READER_URL, make_url(pg_url).set(username="nobody_here").render_as_string(False))
    with pytest.raises(ReaderUnavailable, match="cannot log in as the read-only role nobody_here"):
        query_readonly(db, "SELECT 1")


def test_a_dropped_role_says_how_to_make_it_anew(db: Engine, pg_url: str, run_cli: Callable) -> None:
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    role = stored_reader(db).role
    with db.begin() as conn:
        conn.execute(sa.text("INSERT INTO problems (dataset, external_id, question) VALUES ('d', '1', 'q')"))
    with _admin(pg_url).connect() as conn:
        conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
        conn.execute(sa.text(f'DROP ROLE "{role}"'))
    with pytest.raises(ReaderUnavailable, match=f"{role}, which was dropped; nothing was run") as refused:
        query_readonly(db, "SELECT 1")
    assert refused.value.hint == "make it anew: lanpo db reader --renew"
    renewed = run_cli("db", "reader", "--renew")
    assert renewed.code == 0 and f"renewed: {role} has a new password" in renewed.out, renewed.err
    assert query_readonly(db, "SELECT current_user, count(*) FROM problems").rows == [(role, 1)]
    test_the_role_reads_and_nothing_else(db)  # the same attributes, settings and grants as the migration's


def _scram_matches(verifier: str, password: str) -> bool:
    """Whether a `SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey` verifier (pg_authid) is for `password`."""
    import base64
    import hashlib
    import hmac

    iterations, salt = verifier.split("$")[1].split(":")
    stored_key = verifier.split("$")[2].split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return base64.b64encode(hashlib.sha256(client_key).digest()).decode() == stored_key


def test_a_reader_that_changed_its_password_is_renewed(db: Engine, run_cli: Callable) -> None:
    """Any role may change its own password: a psql session as the reader can lock lanpo out, until --renew."""
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    login = reader_login(db)

    def verifier() -> str:
        with db.connect() as conn:
            return conn.scalar(sa.text("SELECT rolpassword FROM pg_authid WHERE rolname = :r"), {"r": login.role})

    assert _scram_matches(verifier(), stored_reader(db).password)
    with psycopg.connect(**login.params, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        conn.execute(f"ALTER ROLE \"{login.role}\" PASSWORD 'mine-now'")
    assert _scram_matches(verifier(), "mine-now")
    locked = run_cli("sql", "SELECT 1")
    if locked.code != 0:  # a server that checks passwords (the embedded socket trusts local users)
        assert "hint: if its password was changed, `lanpo db reader --renew`" in locked.err
    old = stored_reader(db).password
    renewed = run_cli("db", "reader", "--renew")
    assert renewed.code == 0, renewed.err
    assert stored_reader(db).password != old and _scram_matches(verifier(), stored_reader(db).password)
    assert run_cli("sql", "SELECT current_user", "--format", "csv").out.splitlines() == ["current_user", login.role]


def test_a_reader_that_changed_its_own_defaults_is_told_and_renewed(db: Engine, run_cli: Callable) -> None:
    """No privilege stops `ALTER ROLE current_user SET ...` in a read-write transaction, in any database: `lanpo db
    reader` names every changed default, `--renew` puts back migration 0004's settings and only those."""
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    login = reader_login(db)
    with psycopg.connect(**login.params, autocommit=True) as conn:
        conn.execute("BEGIN READ WRITE")
        conn.execute("ALTER ROLE current_user SET statement_timeout = 0")
        conn.execute("ALTER ROLE current_user SET default_transaction_read_only = off")
        conn.execute("ALTER ROLE current_user SET work_mem = '1GB'")
        conn.execute(f'ALTER ROLE current_user IN DATABASE "{login.params["dbname"]}" SET search_path = pg_temp')
        conn.execute("COMMIT")
    drift = settings_drift(db, login.role)
    assert set(drift) == {
        "statement_timeout=0",
        "default_transaction_read_only=off",
        "work_mem=1GB",
        f"search_path=pg_temp (in database {login.params['dbname']})",
    }
    told = run_cli("db", "reader")
    assert told.code == 0 and "changed its own session defaults (" in told.err and "--renew" in told.err
    assert all(item in told.err for item in drift)
    renewed = run_cli("db", "reader", "--renew")
    assert renewed.code == 0 and renewed.err == "", renewed.err
    assert settings_drift(db, login.role) == []
    with db.connect() as conn:
        config = conn.scalars(
            sa.text("SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                    "WHERE r.rolname = :r ORDER BY 1"),
            {"r": login.role},
        ).all()  # fmt: skip
    assert config == ["default_transaction_read_only=on", "statement_timeout=60s"]


def test_renew_refuses_under_an_explicit_reader_url(run_cli: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_READER_URL, "postgresql://someone@localhost/lanpo")
    refused = run_cli("db", "reader", "--renew")
    assert refused.code == 2 and refused.err.startswith(f"error: {ENV_READER_URL} is set")


def test_one_role_per_database(db: Engine, pg_url: str) -> None:
    """A second lanpo database on the same server gets its own reader, and neither reads the other."""
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    other = f"lanpo_other_{secrets.token_hex(4)}"
    admin = _admin(pg_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{other}"'))
    other_engine = sa.create_engine(make_url(pg_url).set(database=other), poolclass=sa.pool.NullPool)
    try:
        migrate.upgrade(other_engine)
        mine, theirs = stored_reader(db).role, stored_reader(other_engine).role
        assert mine != theirs and theirs == f"lanpo_reader_{other}"
        with other_engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO problems (dataset, external_id, question) VALUES ('o', '1', 'q')"))
        assert query_readonly(other_engine, "SELECT count(*) FROM problems").rows == [(1,)]
        stranger = reader_login(db)
        stranger_there = {**stranger.params, "dbname": other}
        with psycopg.connect(**stranger_there) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM problems")
    finally:
        other_engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{other}" WITH (FORCE)'))
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "lanpo_reader_{other}"'))
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "lanpo_serve_{other}"'))
        admin.dispose()


def test_owner_without_createrole_gets_the_administrators_sql(
    db: Engine, pg_url: str, run_cli: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrade as an owner that may not create roles, run the printed SQL as the superuser, then query."""
    if not _superuser(db):
        pytest.skip("the test server's user is not a superuser")
    suffix = secrets.token_hex(4)
    owner, password, database = f"lanpo_owner_{suffix}", secrets.token_urlsafe(16), f"lanpo_noadmin_{suffix}"
    admin = _admin(pg_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {owner} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB PASSWORD '{password}'"))
        conn.execute(sa.text(f"CREATE DATABASE {database} OWNER {owner}"))
    there = _admin(pg_url, database)
    reader = f"lanpo_reader_{database}"
    try:
        owner_url = make_url(pg_url).set(username=owner, password=password, database=database)
        monkeypatch.setenv("LANPO_DATABASE_URL", owner_url.render_as_string(hide_password=False))
        no_vector = run_cli("db", "upgrade")  # pgvector is not a trusted extension: a superuser must create it
        assert no_vector.code == 2 and no_vector.err.startswith(
            f'error: user {owner} may not create the extension vector in database "{database}"'
        )
        assert "nothing was migrated" in no_vector.err and "\n    CREATE EXTENSION vector;\n" in no_vector.err
        with there.connect() as conn:
            assert not sa.inspect(conn).has_table("alembic_version")
            conn.execute(sa.text("CREATE EXTENSION vector"))  # the administrator
        up = run_cli("db", "upgrade")
        assert up.code == 0 and f"schema at {migrate.head_revision()}" in up.out, up.err
        assert (
            f"warning: lanpo runs your SQL as the read-only role {reader}, which does not exist" in up.err
            and "CREATE ROLE" in up.err
        )

        refused = run_cli("sql", "SELECT count(*) FROM pool_current")
        assert refused.code == 2 and refused.out == ""
        first, hint = refused.err.split("\n", 1)
        assert first.startswith(f"error: lanpo runs your SQL as the read-only role {reader}, which does not exist")
        assert f"the user {owner} that ran `lanpo db upgrade` may not create roles; nothing was run" in first
        assert hint.startswith("  hint: an administrator (a superuser) runs this")
        statements = [line.strip() for line in hint.splitlines() if re.match(r"^    [A-Z].*;$", line)]
        assert statements[0].startswith(f'CREATE ROLE "{reader}" WITH LOGIN NOSUPERUSER')
        for needed in (
            "SET default_transaction_read_only = on",
            "SET statement_timeout = '60s'",
            "GRANT SELECT ON ALL",
        ):
            assert any(needed in s for s in statements), needed
        assert any(s.startswith("ALTER DEFAULT PRIVILEGES") for s in statements)
        assert any(s.startswith("REVOKE EXECUTE ON FUNCTION") and "pg_terminate_backend" in s for s in statements)
        export = re.search(rf"export {ENV_READER_URL}='([^']+)'", hint)
        assert export is not None

        with there.connect() as conn:  # the administrator
            for statement in statements[:-1]:  # all but 0007's revoke of the large-object functions
                conn.execute(sa.text(statement))
        assert statements[-1].startswith("REVOKE EXECUTE ON FUNCTION lo_creat(integer)")
        psql = run_cli("db", "url", "--libpq")  # a psql session could still commit large objects: refused
        assert psql.code == 2 and psql.out == "" and "may still write large objects (lo_creat" in psql.err
        assert "REVOKE EXECUTE ON FUNCTION lo_creat(integer), lo_create(oid)" in psql.err
        assert run_cli("sql", "SELECT 1").code == 0  # its transaction is always rolled back
        with there.connect() as conn:
            conn.execute(sa.text(statements[-1]))
            # and the serving role's (migration 0014), which `lanpo db status` asks for too
            conn.exec_driver_sql(conn.scalar(sa.text("SELECT setup_sql FROM lanpo_private.serve_login")))
        assert run_cli("db", "status").err == ""  # nothing left to do
        assert run_cli("db", "url", "--libpq").code == 0

        stored = run_cli("sql", "SELECT current_user, count(*) FROM pool_current", "--format", "csv")
        assert stored.code == 0 and stored.out.splitlines()[1] == f"{reader},0", stored.err
        monkeypatch.setenv(ENV_READER_URL, export.group(1))
        explicit = run_cli("sql", "SELECT current_user", "--format", "csv")
        assert explicit.code == 0 and explicit.out.splitlines() == ["current_user", reader], explicit.err
        kill = run_cli("sql", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
        assert kill.code == 2 and "permission denied for function pg_terminate_backend" in kill.err

        monkeypatch.delenv(ENV_READER_URL)
        before = run_cli("sql", "SELECT 1").code
        renew = run_cli("db", "reader", "--renew")  # this owner may not alter the role: nothing changes
        assert renew.code == 2 and f"may not alter the role {reader}; nothing was changed" in renew.err
        assert "ALTER ROLE" in renew.err and run_cli("sql", "SELECT 1").code == before == 0

        down = run_cli("db", "downgrade", "0003")  # the owner may revoke its grants but not drop the role
        assert down.code == 0, down.err
        with there.connect() as conn:
            assert not conn.scalar(sa.text("SELECT has_table_privilege(:r, 'problems', 'SELECT')"), {"r": reader})
    finally:
        there.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "{reader}"'))
            conn.execute(sa.text(f'DROP ROLE IF EXISTS "lanpo_serve_{database}"'))
            conn.execute(sa.text(f"DROP ROLE {owner}"))
        admin.dispose()


def test_libpq_uri_forms() -> None:
    socket = libpq_uri({"host": "/tmp/x y", "dbname": "lanpo", "user": "r", "password": "p"}, with_password=False)
    assert socket == "postgresql://r@/lanpo?host=/tmp/x%20y"
    tcp = {
        "host": "db.example.com",
        "port": 5433,
        "dbname": "lanpo",
        "user": "u@x",
        "password": "p:w",
        "sslmode": "require",
    }
    assert libpq_uri(tcp) == "postgresql://u%40x:p%3Aw@db.example.com:5433/lanpo?sslmode=require"
