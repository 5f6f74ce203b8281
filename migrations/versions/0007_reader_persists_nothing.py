"""the read-only role persists nothing: no large objects, WAL messages or objects in public

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Migration 0004 made the reader read-only by grants on lanpo's tables and by `default_transaction_read_only`.
The default is only a default: a psql session as the reader runs `BEGIN READ WRITE`, and what needs no grant
then commits. Measured on the embedded PostgreSQL 18.4 and on PostgreSQL 15.18: `lo_from_bytea`, psql's
`\\lo_import` (`lo_creat` / `lo_open` / `lowrite` through the fastpath) and `pg_logical_emit_message` all
committed as the reader, and on PostgreSQL 14 and older PUBLIC may also CREATE in the schema `public`.

- EXECUTE on every large-object function that creates, writes, truncates or unlinks is revoked from PUBLIC in
  this database (`pg_proc` is per database), and on `pg_logical_emit_message` (it writes WAL, which a logical
  replication slot keeps). No lanpo code uses either.
- CREATE on the schema `public` is revoked from PUBLIC (already so from PostgreSQL 15 on).

Revoking on `pg_catalog` functions needs a superuser, and on the schema its owner; what the migrating user may
not run is appended to `lanpo_private.reader_login.setup_sql`, which `lanpo db upgrade | status | reader` print
for an administrator, and until it is run `lanpo db psql` and `lanpo db url --libpq` refuse to hand out the
reader (`lanpo sql` keeps working: its transaction is read-only and always rolled back).

What no privilege stops: a role may change its own password and its own session defaults (`ALTER ROLE
current_user ...`). `lanpo db reader` detects both, and `lanpo db reader --renew` resets them.

Downgrade grants EXECUTE back to PUBLIC (the server's default) and, before PostgreSQL 15, CREATE on `public`.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

log = logging.getLogger("lanpo.migrations")

# lo_open and loread stay: with nothing to create, a reader can open only objects someone granted it.
WRITE_FUNCTIONS = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace
  AND p.proname IN ('lo_creat', 'lo_create', 'lo_from_bytea', 'lo_import', 'lo_put', 'lowrite', 'lo_truncate',
                    'lo_truncate64', 'lo_unlink', 'pg_logical_emit_message')
ORDER BY 1
"""


def _me(bind: sa.Connection) -> sa.Row:
    return bind.execute(
        sa.text(
            "SELECT r.rolsuper, pg_has_role(n.nspowner, 'USAGE') OR r.rolsuper AS owns_public, "
            "current_setting('server_version_num')::int AS server_version "
            "FROM pg_roles r CROSS JOIN pg_namespace n WHERE r.rolname = current_user AND n.nspname = 'public'"
        )
    ).one()


def upgrade() -> None:
    bind = op.get_bind()
    me = _me(bind)
    functions = ", ".join(bind.scalars(sa.text(WRITE_FUNCTIONS)))
    steps = [
        (f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC", me.rolsuper),
        ("REVOKE CREATE ON SCHEMA public FROM PUBLIC", me.owns_public),
    ]
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
    if left:
        bind.execute(
            sa.text("UPDATE lanpo_private.reader_login SET setup_sql = setup_sql || :s"),
            {"s": "".join(f"{s};\n" for s in left)},
        )
        log.warning(
            "the read-only role may still write outside lanpo's tables: this user may not run %d statement(s); "
            "`lanpo db status` prints them for an administrator",
            len(left),
        )


def downgrade() -> None:
    bind = op.get_bind()
    me = _me(bind)
    if me.rolsuper:
        op.execute(f"GRANT EXECUTE ON FUNCTION {', '.join(bind.scalars(sa.text(WRITE_FUNCTIONS)))} TO PUBLIC")
    if me.owns_public and me.server_version < 150000:
        op.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    bind.execute(
        sa.text(
            "UPDATE lanpo_private.reader_login SET setup_sql = regexp_replace(setup_sql, "
            "'REVOKE (EXECUTE ON FUNCTION [^\\n]*pg_logical_emit_message|CREATE ON SCHEMA public)[^\\n]*\\n', '', 'g')"
        )
    )
