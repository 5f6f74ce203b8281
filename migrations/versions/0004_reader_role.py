"""read-only role for user SQL

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

`lanpo sql`, `lanpo db psql` and `lanpo db url --libpq` run user SQL as a role that can read lanpo's tables
and views and nothing else: a READ ONLY transaction run as the superuser is no sandbox (`COPY ... TO PROGRAM`
still runs). A role is cluster-wide but grants are per database, and tests create several lanpo databases on
one server, so the role is named for the database: `lanpo_reader_<database>` (cut to 63 bytes with a hash).

- `LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS`, no role memberships, a
  random password; settings `default_transaction_read_only = on` and `statement_timeout = '60s'` (psql
  sessions get them too; `lanpo sql` sets both per transaction anyway).
- SELECT on every table and view in `public`, and through default privileges on those the owner creates
  there later (later revisions need not grant anything).
- EXECUTE on `pg_terminate_backend`, `pg_cancel_backend` and the advisory-lock functions is revoked from
  PUBLIC in this database (`pg_proc` is per database) and granted to the owner: a plain role may signal
  the backends of its own role and take any advisory lock, so a reader could otherwise kill another
  reader's query or hold the trainer's global-cap lock. TEMPORARY on the database is revoked from PUBLIC.
- The login lives in `lanpo_private.reader_login`, a schema with no grants: only the owner reads it.

A user that may not create roles (or revoke on system functions) gets everything else; the statements it
could not run are kept in `reader_login.setup_sql`, and `lanpo db upgrade` / `lanpo sql` print them for an
administrator. Downgrade revokes and drops the role (`DROP OWNED BY` in this database first).
"""

from __future__ import annotations

import hashlib
import logging
import secrets

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

log = logging.getLogger("lanpo.migrations")

ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
ROLE_SETTINGS = {"default_transaction_read_only": "on", "statement_timeout": "'60s'"}

# Functions a plain role may use against other sessions of its role, or to block the trainer (unlocking
# acts on one's own locks only, so the unlock functions stay).
SESSION_FUNCTIONS = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace
  AND (p.proname IN ('pg_terminate_backend', 'pg_cancel_backend') OR p.proname ~ '^pg_(try_)?advisory_(xact_)?lock')
ORDER BY 1
"""


def role_name(database: str) -> str:
    """`lanpo_reader_<database>`, cut to Postgres' 63-byte identifier limit with a hash to keep it unique."""
    name = f"lanpo_reader_{database}"
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(database.encode()).hexdigest()[:8]
    head = database.encode()[: 63 - len("lanpo_reader_") - len(digest) - 1].decode(errors="ignore")
    return f"lanpo_reader_{head}_{digest}"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def upgrade() -> None:
    bind = op.get_bind()
    me = bind.execute(
        sa.text(
            "SELECT r.rolname, current_database() AS database, r.rolsuper, r.rolcreaterole, "
            "d.datdba = r.oid AS owns_database FROM pg_roles r JOIN pg_database d ON d.datname = current_database() "
            "WHERE r.rolname = current_user"
        )
    ).one()
    role, owner, database = role_name(me.database), ident(me.rolname), ident(me.database)
    password = secrets.token_urlsafe(32)
    exists = bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}) > 0

    op.execute("CREATE SCHEMA lanpo_private")
    op.execute("REVOKE ALL ON SCHEMA lanpo_private FROM PUBLIC")
    op.execute(
        "CREATE TABLE lanpo_private.reader_login (role_name text PRIMARY KEY, password text NOT NULL, "
        "setup_sql text NOT NULL DEFAULT '', created_at timestamptz NOT NULL DEFAULT now())"
    )

    r = ident(role)
    may_manage_roles = me.rolsuper or me.rolcreaterole
    # (statement, whether this user may run it); what it may not or cannot run is left for an administrator.
    steps = [
        (
            f"{'ALTER' if exists else 'CREATE'} ROLE {r} WITH {ROLE_ATTRIBUTES} PASSWORD {literal(password)}",
            may_manage_roles,
        ),
        *((f"ALTER ROLE {r} SET {k} = {v}", may_manage_roles) for k, v in ROLE_SETTINGS.items()),
        (f"GRANT USAGE ON SCHEMA public TO {r}", me.rolsuper or me.owns_database),
        (f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r}", True),
        (f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public GRANT SELECT ON TABLES TO {r}", True),
    ]
    functions = ", ".join(bind.scalars(sa.text(SESSION_FUNCTIONS)))
    if not me.rolsuper:  # a superuser owner needs no grant; a plain one keeps its global-cap lock
        steps.append((f"GRANT EXECUTE ON FUNCTION {functions} TO {owner}", False))
    steps.append((f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC", me.rolsuper))
    steps.append((f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC", me.rolsuper or me.owns_database))

    left: list[str] = []
    for statement, allowed in steps:
        if not allowed:
            left.append(statement)
            continue
        try:
            with bind.begin_nested():
                bind.exec_driver_sql(statement)
        except sa.exc.DBAPIError:
            left.append(statement)
    bind.execute(
        sa.text("INSERT INTO lanpo_private.reader_login (role_name, password, setup_sql) VALUES (:r, :p, :s)"),
        {"r": role, "p": password, "s": "".join(f"{s};\n" for s in left)},
    )
    if left:
        log.warning(
            "the read-only role %s is not fully set up: user %s may not run %d statement(s); "
            "`lanpo db status` prints them for an administrator",
            role,
            me.rolname,
            len(left),
        )


def downgrade() -> None:
    bind = op.get_bind()
    me = bind.execute(
        sa.text(
            "SELECT r.rolname, current_database() AS database, r.rolsuper, d.datdba = r.oid AS owns_database "
            "FROM pg_roles r JOIN pg_database d ON d.datname = current_database() WHERE r.rolname = current_user"
        )
    ).one()
    owner = ident(me.rolname)
    role = bind.scalar(sa.text("SELECT role_name FROM lanpo_private.reader_login"))
    if role and bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}):
        r = ident(role)
        # DROP OWNED BY needs membership in the role; a user without it revokes what it may instead.
        for statement in (
            f"DROP OWNED BY {r}",
            f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {r}",
            f"REVOKE ALL ON SCHEMA public FROM {r}",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public REVOKE SELECT ON TABLES FROM {r}",
            f"DROP ROLE {r}",
        ):
            try:
                with bind.begin_nested():
                    bind.exec_driver_sql(statement)
            except sa.exc.DBAPIError as exc:
                if statement.startswith("DROP ROLE"):
                    log.warning(
                        "could not drop the role %s (%s): an administrator may run %s", role, exc.orig, statement
                    )
    if me.rolsuper:
        op.execute(f"GRANT EXECUTE ON FUNCTION {', '.join(bind.scalars(sa.text(SESSION_FUNCTIONS)))} TO PUBLIC")
    if me.rolsuper or me.owns_database:
        op.execute(f"GRANT TEMPORARY ON DATABASE {ident(me.database)} TO PUBLIC")
    op.execute("DROP SCHEMA lanpo_private CASCADE")
