"""The read-only role that user SQL runs as (`lanpo sql`, `lanpo db psql`, `lanpo db url --libpq`).

Migration 0004 creates `lanpo_reader_<database>` with a random password kept in `lanpo_private.reader_login`,
which only the owner can read. lanpo reads it as the owner and logs in as the reader itself: a superuser
session that `SET ROLE`s to the reader is no sandbox, since it can always switch back. `LANPO_READER_URL`
names an administrator-made reader instead. Before any user SQL runs, the login is checked to be
unprivileged; lanpo refuses otherwise and never falls back to the owner.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from lanpo.db.connection import is_embedded, normalise_url
from lanpo.errors import LanpoError, ReaderUnavailable

ENV_READER_URL = "LANPO_READER_URL"
RENEW_COMMAND = "lanpo db reader --renew"

# What migration 0004 gives the role; `renew` restores the same.
ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
ROLE_SETTINGS = {"default_transaction_read_only": "on", "statement_timeout": "'60s'"}

# Predefined roles that reach past SELECT: server files and programs, other sessions, all data, maintenance.
PRIVILEGED_ROLES = (
    "pg_execute_server_program",
    "pg_write_server_files",
    "pg_read_server_files",
    "pg_signal_backend",
    "pg_read_all_data",
    "pg_write_all_data",
    "pg_maintain",
    "pg_checkpoint",
    "pg_create_subscription",
)

WRITE = "INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER"

# Writes that need no grant on a table, and which a client running its own transactions (psql after `BEGIN READ
# WRITE`) would commit: large objects, WAL messages, objects in a schema or the database. Migration 0007 revokes
# the functions and `public`'s CREATE from PUBLIC; this asks what the connected role may still do.
PERSISTING_WRITES = """
SELECT ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'pg_catalog'::regnamespace AND has_function_privilege(me.oid, p.oid, 'EXECUTE')
               AND p.proname IN ('lo_creat', 'lo_create', 'lo_from_bytea', 'lo_import', 'lo_put', 'lowrite',
                                 'lo_truncate', 'lo_truncate64', 'lo_unlink', 'pg_logical_emit_message')
             ORDER BY 1) AS functions,
       ARRAY(SELECT n.nspname::text FROM pg_namespace n WHERE has_schema_privilege(me.oid, n.oid, 'CREATE')
             ORDER BY 1) AS schemas,
       ARRAY(SELECT p FROM unnest(ARRAY['CREATE', 'TEMPORARY']) p
             WHERE has_database_privilege(me.oid, current_database(), p)) AS database,
       me.rolname::text AS role, current_database() AS dbname
FROM pg_roles me WHERE me.rolname = coalesce(%(role)s, current_user)
"""

# Refused: dangerous attributes; membership (even NOINHERIT: SET ROLE) in a privileged role, an owner of lanpo's
# tables or database, or a role that may write to them; write access of its own.
PRIVILEGE_CHECK = """
WITH me AS (SELECT * FROM pg_roles WHERE rolname = current_user),
lanpo_tables AS (
    SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
),
owners AS (
    SELECT c.relowner AS oid FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
    UNION SELECT d.datdba FROM pg_database d WHERE d.datname = current_database()
)
SELECT me.rolname,
       array_remove(ARRAY[CASE WHEN me.rolsuper THEN 'SUPERUSER' END, CASE WHEN me.rolcreaterole THEN 'CREATEROLE' END,
             CASE WHEN me.rolcreatedb THEN 'CREATEDB' END, CASE WHEN me.rolreplication THEN 'REPLICATION' END,
             CASE WHEN me.rolbypassrls THEN 'BYPASSRLS' END], NULL) AS attributes,
       ARRAY(SELECT r.rolname::text FROM pg_roles r
             WHERE r.oid <> me.oid AND pg_has_role(me.oid, r.oid, 'MEMBER')
               AND (r.rolname = ANY(%(privileged)s) OR r.rolsuper OR r.rolcreaterole OR r.rolcreatedb
                    OR r.rolreplication OR r.rolbypassrls OR r.oid IN (SELECT oid FROM owners)
                    OR EXISTS (SELECT 1 FROM lanpo_tables t WHERE has_table_privilege(r.oid, t.oid, %(write)s)))
             ORDER BY 1) AS memberships,
       ARRAY(SELECT r.rolname::text FROM pg_roles r WHERE r.oid = me.oid AND r.oid IN (SELECT oid FROM owners))
           AS owns,
       ARRAY(SELECT t.oid::regclass::text FROM lanpo_tables t WHERE has_table_privilege(me.oid, t.oid, %(write)s)
             ORDER BY 1) AS writable
FROM me
"""


@dataclass(frozen=True)
class ReaderLogin:
    """How to log in as the reader: libpq keywords (host, port, dbname, user, password, sslmode, ...)."""

    role: str
    params: dict[str, Any]
    source: str  # where the login came from, for messages

    def connect(self, application_name: str = "lanpo sql", own_transactions: bool = False) -> psycopg.Connection:
        """A connection as the reader, checked to be unprivileged (else ReaderUnavailable, and it is closed).

        `own_transactions`: the login goes to a client that runs its own transactions (psql), so it must not
        be able to write anything that needs no grant either (`check_persists_nothing`). `lanpo sql` needs no
        such check: its one statement runs in a READ ONLY transaction that is always rolled back.
        """
        try:
            conn = psycopg.connect(**{"application_name": application_name, "connect_timeout": 10, **self.params})
        except psycopg.OperationalError as exc:
            hint = (
                f"check {ENV_READER_URL}, or unset it to use the role `lanpo db upgrade` made"
                if self.source == ENV_READER_URL
                # Postgres lets every role change its own password, so a reader's psql session can lock lanpo out.
                else f"if its password was changed, `{RENEW_COMMAND}` sets a new one"
            )
            raise ReaderUnavailable(
                f"cannot log in as the read-only role {self.role} ({self.source}): {str(exc).strip()}", hint=hint
            ) from exc
        try:
            check_unprivileged(conn, self.source)
            if own_transactions:
                check_persists_nothing(conn, self.source)
        except BaseException:
            conn.close()
            raise
        return conn

    def uri(self, with_password: bool = True) -> str:
        return libpq_uri(self.params, with_password)


def connect_params(url: URL | str) -> dict[str, Any]:
    """libpq keywords for a SQLAlchemy URL (psycopg driver), as SQLAlchemy itself would connect."""
    url = make_url(normalise_url(url)) if isinstance(url, str) else url
    _, params = url.get_dialect()().create_connect_args(url)
    return {k: v for k, v in params.items() if v not in (None, "")}


def libpq_uri(params: dict[str, Any], with_password: bool = True) -> str:
    """`postgresql://user[:password]@host:port/dbname?...`: a URI psql and any libpq client accept.

    A socket directory (or several hosts) goes in `?host=`, as libpq documents for unix sockets.
    """
    params = dict(params)
    user, password = params.pop("user", ""), params.pop("password", None)
    host, port, dbname = str(params.pop("host", "")), params.pop("port", None), params.pop("dbname", "")
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password and with_password else "")
    netloc = f"{auth}@" if auth else ""
    if host and not host.startswith("/") and "," not in host:
        netloc += host + (f":{port}" if port else "")
    else:
        params = {**({"host": host} if host else {}), **({"port": port} if port else {}), **params}
    query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in params.items())
    return f"postgresql://{netloc}/{quote(dbname, safe='')}" + (f"?{query}" if query else "")


@dataclass(frozen=True)
class StoredReader:
    """What migration 0004 recorded, and whether the role exists now."""

    role: str
    password: str
    setup_sql: str
    exists: bool
    owner: str
    database: str


def stored_reader(owner: Engine) -> StoredReader:
    with owner.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT l.role_name, l.password, l.setup_sql, current_user AS owner, current_database() AS database, "
                "EXISTS (SELECT 1 FROM pg_roles WHERE rolname = l.role_name) AS exists "
                "FROM lanpo_private.reader_login l"
            )
        ).one()
    return StoredReader(row.role_name, row.password, row.setup_sql, row.exists, row.owner, row.database)


def reader_login(owner: Engine) -> ReaderLogin:
    """`LANPO_READER_URL` when set, else the role migration 0004 made (ReaderUnavailable if it is missing)."""
    explicit = os.environ.get(ENV_READER_URL)
    if explicit:
        params = connect_params(explicit)
        return ReaderLogin(str(params.get("user", "")), params, ENV_READER_URL)
    stored = stored_reader(owner)
    params = {**connect_params(owner.url), "user": stored.role, "password": stored.password}
    if not stored.exists:
        raise _missing(stored, params)
    return ReaderLogin(stored.role, params, "lanpo_private.reader_login")


def _missing(stored: StoredReader, params: dict[str, Any], outcome: str = "nothing was run") -> ReaderUnavailable:
    if not stored.setup_sql:  # the migration made it, and someone dropped it since
        return ReaderUnavailable(
            f"lanpo runs your SQL as the read-only role {stored.role}, which was dropped; {outcome}",
            hint=f"make it anew: {RENEW_COMMAND}",
        )
    return ReaderUnavailable(
        f"lanpo runs your SQL as the read-only role {stored.role}, which does not exist: the user "
        f"{stored.owner} that ran `lanpo db upgrade` may not create roles; {outcome}",
        hint=f'an administrator (a superuser) runs this in database "{stored.database}", then lanpo logs in as that '
        "role with the password in it; for a reader made another way, export its login as below",
        detail=f"{stored.setup_sql}\n\nexport {ENV_READER_URL}='{libpq_uri(params)}'",
    )


def check_unprivileged(conn: psycopg.Connection, source: str) -> None:
    """Refuse (ReaderUnavailable) unless the connected role can do no more than read."""
    role, problems = privilege_problems(conn, WRITE)
    if problems:
        raise ReaderUnavailable(
            f"refused: the role {role} ({source}) that would run your SQL {'; '.join(problems)}; nothing was run",
            hint=f"point {ENV_READER_URL} at a role with SELECT on lanpo's tables only, or unset it (see docs/sql.md)",
        )


def privilege_problems(conn: psycopg.Connection, write: str) -> tuple[str, list[str]]:
    """The connected role, and what makes it privileged: dangerous attributes, membership in a privileged role (or
    an owner, or a role that may `write` lanpo's tables), ownership, or the table privileges `write` of its own."""
    with conn.cursor() as cur:
        cur.execute(PRIVILEGE_CHECK, {"privileged": list(PRIVILEGED_ROLES), "write": write})  # type: ignore[arg-type]
        role, attributes, memberships, owns, writable = cur.fetchone()  # type: ignore[misc]
    conn.rollback()
    problems = (
        [f"has {', '.join(attributes)}"] * bool(attributes)
        + [f"is a member of {', '.join(memberships)}"] * bool(memberships)
        + ["owns lanpo's tables or database"] * bool(owns)
        + [f"may write to {', '.join(writable[:3])}{' ...' if len(writable) > 3 else ''}"] * bool(writable)
    )
    return role, problems


def check_persists_nothing(conn: psycopg.Connection, source: str) -> None:
    """Refuse (ReaderUnavailable, with the administrator's SQL) if the connected role could commit a write that
    needs no grant on lanpo's tables: psql's `BEGIN READ WRITE` overrides `default_transaction_read_only`."""
    problems, statements = persisting_writes(conn)
    if problems:
        raise ReaderUnavailable(
            f"refused: the read-only role {conn.info.user} ({source}) may still {'; '.join(problems)}, and a client "
            "that runs its own transactions (psql) would keep what it writes; no login was handed out",
            hint="an administrator (a superuser) runs this in the database, then you try again; "
            'lanpo sql "SELECT ..." works meanwhile (its transaction is read-only and always rolled back)',
            detail="\n".join(f"{s};" for s in statements),
        )


def persisting_writes(conn: psycopg.Connection, role: str | None = None) -> tuple[list[str], list[str]]:
    """What `role` (default: the connected one) may write without a grant on a table, and the SQL that revokes it."""
    with conn.cursor() as cur:
        cur.execute(PERSISTING_WRITES, {"role": role})
        functions, schemas, database, role, dbname = cur.fetchone()  # type: ignore[misc]
    conn.rollback()
    grantees = f"PUBLIC, {_ident(role)}"
    problems, statements = [], []
    if functions:
        names = dict.fromkeys(f.split("(")[0] for f in functions)
        large_objects = [n for n in names if n.startswith("lo")]
        problems += [f"write large objects ({', '.join(large_objects)})"] * bool(large_objects)
        problems += ["write WAL messages (pg_logical_emit_message)"] * ("pg_logical_emit_message" in names)
        statements.append(f"REVOKE EXECUTE ON FUNCTION {', '.join(functions)} FROM {grantees}")
    for schema in schemas:
        problems.append(f"create objects in schema {schema}")
        statements.append(f"REVOKE CREATE ON SCHEMA {_ident(schema)} FROM {grantees}")
    if database:
        problems.append(f"{' and '.join(database)} on database {dbname}")
        statements.append(f"REVOKE {', '.join(database)} ON DATABASE {_ident(dbname)} FROM {grantees}")
    return problems, statements


def settings_drift(owner: Engine, role: str, settings: dict[str, str] = ROLE_SETTINGS) -> list[str]:
    """The role's session defaults that differ from `settings` (the reader's: migration 0004's), as `name=value`
    (empty: as made).

    No privilege stops a role from `ALTER ROLE current_user SET ...` (nor from changing its own password);
    `lanpo db reader --renew` resets them.
    """
    want = {k: v.strip("'") for k, v in settings.items()}
    with owner.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT coalesce(d.datname, '') AS db, s.setconfig FROM pg_db_role_setting s "
                "JOIN pg_roles r ON r.oid = s.setrole LEFT JOIN pg_database d ON d.oid = s.setdatabase "
                "WHERE r.rolname = :r ORDER BY 1"
            ),
            {"r": role},
        ).all()
    have = {(db, item.partition("=")[0]): item.partition("=")[2] for db, config in rows for item in config}
    drift = [
        f"{name}={value}" + (f" (in database {db})" if db else "")
        for (db, name), value in have.items()
        if db or want.get(name) != value
    ]
    drift += [f"{name} unset" for name in want if ("", name) not in have]
    return drift


def setup_notices(owner: Engine) -> list[str]:
    """What is missing from the reader's setup, or was changed since, each with its fix (empty: all set)."""
    stored = stored_reader(owner)
    if not stored.exists:
        params = {**connect_params(owner.url), "user": stored.role, "password": stored.password}
        return [str(_missing(stored, params, "`lanpo sql` and `lanpo db psql` refuse to run without it"))]
    with owner.connect() as conn:
        signals = conn.scalar(
            sa.text("SELECT has_function_privilege('public', 'pg_catalog.pg_cancel_backend(integer)', 'EXECUTE')")
        )
        problems, statements = persisting_writes(conn.connection.driver_connection, stored.role)
    notices = []
    if problems:
        notices.append(
            f"the read-only role {stored.role} may still {'; '.join(problems)}, which a psql session would keep: "
            f"`lanpo db psql` and `lanpo db url --libpq` refuse until a superuser runs in database "
            f'"{stored.database}":\n\n' + "".join(f"    {s};\n" for s in statements)
        )
    if signals and stored.setup_sql:
        notices.append(
            f"readers ({stored.role}) may cancel each other's queries and take advisory locks; "
            f'a superuser can revoke that in database "{stored.database}":\n\n'
            + "".join(f"    {line}\n" for line in stored.setup_sql.splitlines() if "pg_cancel_backend" in line)
        )
    drift = settings_drift(owner, stored.role)
    if drift:
        notices.append(
            f"the read-only role {stored.role} changed its own session defaults ({', '.join(drift)}); "
            f"`{RENEW_COMMAND}` puts back migration 0004's"
        )
    return notices


def reader_uri(login: ReaderLogin) -> str:
    """The login as a libpq URI; no password for the embedded server, whose socket trusts local users."""
    return login.uri(with_password=not (is_embedded() and login.source != ENV_READER_URL))


def renew(owner: Engine) -> StoredReader:
    """Give the reader a new password, making the role anew if it was dropped; its grants are restored.

    Postgres lets every role change its own password and session defaults, so a reader's psql session can lock
    lanpo out or drop its statement timeout; and an administrator may drop the role. Either way the owner (if it
    may manage roles) puts back what migration 0004 made: the role with its attributes and only its settings,
    SELECT on every table and view, and the default privileges for later ones. What the owner may not run is
    kept in `setup_sql` for an administrator, as the migration does. One transaction: a failure leaves the old
    login in place.
    """

    def grants(role: str, me: sa.Row) -> list[tuple[str, bool]]:
        return [
            (f"GRANT USAGE ON SCHEMA public TO {role}", me.grants_schema),
            (f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}", True),
            (
                f"ALTER DEFAULT PRIVILEGES FOR ROLE {_ident(me.rolname)} IN SCHEMA public GRANT SELECT ON TABLES "
                f"TO {role}",
                True,
            ),
        ]

    renew_role(owner, "reader_login", ROLE_SETTINGS, grants, ReaderUnavailable, "lanpo db reader")
    return stored_reader(owner)


def renew_role(
    owner: Engine,
    login_table: str,
    settings: dict[str, str],
    grants: Callable[[str, sa.Row], list[tuple[str, bool]]],
    error: type[LanpoError],
    check_command: str,
) -> None:
    """Put back the role recorded in `lanpo_private.<login_table>` with a new password: its attributes, only
    `settings`, and `grants(quoted role, the owner's row)` as (statement, whether the owner may run it). What the
    owner may not run goes to `setup_sql`; `error` if it may not even make the role. One transaction."""
    from secrets import token_urlsafe

    password = token_urlsafe(32)
    with owner.begin() as conn:
        me = conn.execute(
            sa.text(
                "SELECT r.rolname, r.rolsuper, r.rolsuper OR r.rolcreaterole AS manages_roles, "
                "r.rolsuper OR d.datdba = r.oid AS grants_schema, l.role_name, "
                "EXISTS (SELECT 1 FROM pg_roles WHERE rolname = l.role_name) AS exists "
                "FROM pg_roles r JOIN pg_database d ON d.datname = current_database() "
                f"CROSS JOIN lanpo_private.{login_table} l WHERE r.rolname = current_user FOR UPDATE OF l"
            )
        ).one()
        role = _ident(me.role_name)
        make = "ALTER" if me.exists else "CREATE"
        # the role may have set its own defaults, in any database: all go before the migration's are put back
        databases = conn.scalars(
            sa.text(
                "SELECT d.datname FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                "JOIN pg_database d ON d.oid = s.setdatabase WHERE r.rolname = :r ORDER BY 1"
            ),
            {"r": me.role_name},
        ).all()
        steps = [
            (f"{make} ROLE {role} WITH {ROLE_ATTRIBUTES} PASSWORD {_literal(password)}", me.manages_roles),
            *((f"ALTER ROLE {role} IN DATABASE {_ident(d)} RESET ALL", me.manages_roles) for d in databases),
            *([(f"ALTER ROLE {role} RESET ALL", me.manages_roles)] if me.exists else []),
            *((f"ALTER ROLE {role} SET {k} = {v}", me.manages_roles) for k, v in settings.items()),
            *grants(role, me),
        ]
        left: list[str] = []
        for statement, allowed in steps:
            if not allowed:
                left.append(statement)
                continue
            try:
                with conn.begin_nested():
                    conn.exec_driver_sql(statement)
            except sa.exc.DBAPIError:
                left.append(statement)
        if left and left[0].startswith(("CREATE ROLE", "ALTER ROLE")) and "PASSWORD" in left[0]:
            raise error(
                f"user {me.rolname} may not {'alter' if me.exists else 'create'} the role {me.role_name}; "
                "nothing was changed",
                hint=f"an administrator (a superuser) runs this in the database, then `{check_command}` checks it",
                detail="\n".join(f"{s};" for s in left),
            )
        conn.execute(
            sa.text(f"UPDATE lanpo_private.{login_table} SET password = :p, setup_sql = :s, created_at = now()"),
            {"p": password, "s": "".join(f"{s};\n" for s in left)},
        )


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
