"""The least-privileged role `lanpo serve` runs its requests' SQL as (migration 0014).

`lanpo_serve_<database>` may read what a request reads (pools, lessons, problems, runs, answers), insert what it
writes (the question as a problem, the serving run, its attempts and contexts, `served_answers`,
`answer_feedback`, metrics, the judge's scores in `judge_cache`), and update only the columns of `runs` its
lifecycle and heartbeat write; it may not change or delete a lesson, an attempt or a problem, read
`lanpo_private`, or create anything. Its random password is kept in `lanpo_private.serve_login`, which only the
owner reads: lanpo reads it as the owner and logs in as the role itself (never `SET ROLE`, which a session can
undo). `LANPO_SERVE_URL` names an administrator-made role instead. The login is checked before it is used: a role
that is a superuser, a member of a privileged or owning role, an owner, or that may UPDATE / DELETE / TRUNCATE a
whole table is refused, and lanpo never falls back to the owner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from lanpo.db.connection import has_serve_setup, normalise_url
from lanpo.db.reader import _ident, connect_params, libpq_uri, privilege_problems, renew_role, settings_drift
from lanpo.errors import ServingRoleUnavailable

ENV_SERVE_URL = "LANPO_SERVE_URL"
RENEW_COMMAND = "lanpo db serve-role --renew"

# What migrations 0014, 0015, 0018, 0021 and 0024 give the role; `renew` restores the same (each grant:
# tests/db/test_serving.py).
ROLE_SETTINGS = {"statement_timeout": "'30s'"}
USE_COLUMNS = ("m", "outcome", "graded", "credit", "baseline", "baseline_n", "baseline_source", "credit_var")
USEFULNESS_COLUMNS = (
    *("uses", "helped", "hurt", "even", "unknown", "graded", "credit", "updated_at", "credit_var"),
    *("net_credit", "net_credit_var"),  # migration 0024: a verdict refits its lessons' pool
)
TABLE_GRANTS = {
    "pools": "SELECT",
    "experiences": "SELECT",
    "experience_versions": "SELECT",
    "problems": "SELECT, INSERT",
    "runs": "SELECT, INSERT, UPDATE (status, finished_at, heartbeat_at, owner)",
    "policy_versions": "SELECT, INSERT",
    "rollout_groups": "SELECT, INSERT",
    "attempts": "SELECT, INSERT",
    "group_contexts": "SELECT, INSERT",
    "run_metrics": "SELECT, INSERT, UPDATE (value)",
    "served_answers": "SELECT, INSERT",
    "answer_feedback": "SELECT, INSERT",
    # a verdict, or a use, recomputes its lessons' rows (migration 0015): UPDATE by column, as a whole-table UPDATE
    # would make check_unprivileged refuse the role
    "lesson_usefulness": f"SELECT, INSERT, UPDATE ({', '.join(USEFULNESS_COLUMNS)})",
    "lesson_uses": f"SELECT, INSERT, UPDATE ({', '.join(USE_COLUMNS)})",  # no DELETE: uses go by cascade
    "judge_cache": "SELECT, INSERT",  # the judge's scores: read, and a miss added (ON CONFLICT DO NOTHING)
}
SEQUENCES = ("rollout_groups_id_seq", "attempts_id_seq")  # ids reserved with nextval() before a COPY
LOCK_FUNCTION = "pg_catalog.pg_advisory_xact_lock(integer, integer)"  # the per-dataset lock of a problem upsert
# Whole-table writes the serving role must not have (column-level UPDATEs on runs and run_metrics are not these).
WRITE = "UPDATE, DELETE, TRUNCATE, TRIGGER"


@dataclass(frozen=True)
class ServeLogin:
    """How to log in as the serving role: a SQLAlchemy URL, and where it came from (for messages)."""

    role: str
    url: URL
    source: str

    def uri(self, with_password: bool = False) -> str:
        return libpq_uri(connect_params(self.url), with_password)


def serve_login(owner: Engine) -> ServeLogin:
    """`LANPO_SERVE_URL` when set, else the role migration 0014 made (ServingRoleUnavailable if it is missing)."""
    explicit = os.environ.get(ENV_SERVE_URL)
    if explicit:
        url = make_url(normalise_url(explicit))
        return ServeLogin(url.username or "", url, ENV_SERVE_URL)
    if not has_serve_setup(owner):
        raise ServingRoleUnavailable(
            "the store has no serving role: its schema is older than migration 0014", hint="run `lanpo db upgrade`"
        )
    with owner.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT l.role_name, l.password, l.setup_sql, current_user AS owner, current_database() AS database, "
                "EXISTS (SELECT 1 FROM pg_roles WHERE rolname = l.role_name) AS exists "
                "FROM lanpo_private.serve_login l"
            )
        ).one()
    login = ServeLogin(
        row.role_name,
        owner.url.set(username=row.role_name, password=row.password),
        "lanpo_private.serve_login",
    )
    if not row.exists:
        if not row.setup_sql:
            raise ServingRoleUnavailable(
                f"lanpo serves as the role {row.role_name}, which was dropped", hint=f"make it anew: {RENEW_COMMAND}"
            )
        raise ServingRoleUnavailable(
            f"lanpo serves as the role {row.role_name}, which does not exist: the user {row.owner} that ran "
            "`lanpo db upgrade` may not create roles",
            hint=f'an administrator (a superuser) runs this in database "{row.database}", then lanpo logs in as '
            "that role with the password in it; for a role made another way, export its login as below",
            detail=f"{row.setup_sql}\n\nexport {ENV_SERVE_URL}='{libpq_uri(connect_params(login.url), True)}'",
        )
    return login


def serve_engine(owner: Engine, **kwargs: Any) -> Engine:
    """An Engine logged in as the serving role (`serve_login`), checked to be unprivileged; ServingRoleUnavailable
    if it cannot log in or is privileged. `kwargs` go to `sqlalchemy.create_engine` (pool size, ...)."""
    login = serve_login(owner)
    engine = sa.create_engine(login.url, pool_pre_ping=True, **kwargs)
    try:
        with engine.connect() as conn:
            check_unprivileged(conn.connection.driver_connection, login.source)  # type: ignore[arg-type]
    except sa.exc.OperationalError as exc:
        engine.dispose()
        hint = (
            f"check {ENV_SERVE_URL}, or unset it to use the role `lanpo db upgrade` made"
            if login.source == ENV_SERVE_URL
            else f"if its password was changed, `{RENEW_COMMAND}` sets a new one"
        )
        why = " ".join(str(exc.orig).split())
        raise ServingRoleUnavailable(
            f"cannot log in as the serving role {login.role} ({login.source}): {why}", hint=hint
        ) from exc
    except BaseException:
        engine.dispose()
        raise
    return engine


def check_unprivileged(conn: psycopg.Connection, source: str) -> None:
    """Refuse (ServingRoleUnavailable) a login that can do more than the serving role: a superuser, a member of a
    privileged or owning role, an owner, or a role that may update, delete or truncate a whole table."""
    role, problems = privilege_problems(conn, WRITE)
    if problems:
        raise ServingRoleUnavailable(
            f"refused: the role {role} ({source}) that would serve requests {'; '.join(problems)}; nothing was run",
            hint=f"point {ENV_SERVE_URL} at a role made as docs/serving.md says, or unset it to use lanpo's own",
        )


def setup_notices(owner: Engine) -> list[str]:
    """What is missing from the serving role's setup, or was changed since, each with its fix (empty: all set)."""
    if os.environ.get(ENV_SERVE_URL) or not has_serve_setup(owner):
        return []
    try:
        login = serve_login(owner)
    except ServingRoleUnavailable as exc:
        return [str(exc)]
    notices = []
    with owner.connect() as conn:
        locks = conn.scalar(
            sa.text("SELECT has_function_privilege(:r, :f, 'EXECUTE')"), {"r": login.role, "f": LOCK_FUNCTION}
        )
    if not locks:  # granted by a superuser only; an administrator who revoked it from PUBLIC after 0014 ran
        notices.append(
            f"the serving role {login.role} may not take the per-dataset lock, so it cannot store a question; a "
            f"superuser runs:\n\n    GRANT EXECUTE ON FUNCTION {LOCK_FUNCTION} TO {_ident(login.role)};\n"
        )
    drift = settings_drift(owner, login.role, ROLE_SETTINGS)
    if drift:
        notices.append(
            f"the serving role {login.role} changed its own session defaults ({', '.join(drift)}); "
            f"`{RENEW_COMMAND}` puts back migration 0014's"
        )
    return notices


def renew(owner: Engine) -> ServeLogin:
    """Give the serving role a new password, making it anew if it was dropped, with migration 0014's settings and
    grants; what the owner may not run is kept in `setup_sql` for an administrator. One transaction."""

    def grants(role: str, me: sa.Row) -> list[tuple[str, bool]]:
        steps = [(f"GRANT USAGE ON SCHEMA public TO {role}", me.grants_schema)]
        steps += [(f"GRANT {what} ON {table} TO {role}", True) for table, what in TABLE_GRANTS.items()]
        steps += [(f"GRANT USAGE ON SEQUENCE {_ident(seq)} TO {role}", True) for seq in SEQUENCES]
        return [*steps, (f"GRANT EXECUTE ON FUNCTION {LOCK_FUNCTION} TO {role}", me.rolsuper)]

    renew_role(owner, "serve_login", ROLE_SETTINGS, grants, ServingRoleUnavailable, "lanpo db serve-role")
    return serve_login(owner)
