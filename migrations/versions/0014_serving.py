"""serving: runs of kind 'serve', served_answers, answer_feedback, feedback in experience_usage, the serving role

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

`lanpo serve` answers requests as attempts of a run of kind `serve` (`lanpo.inference.run.InferenceRun`); this
revision adds what the store keeps besides:

- `served_answers`: one row per request. `request_id` is the response's OpenAI id (`chatcmpl-<uuid hex>`), UNIQUE:
  one request is never stored twice. `group_id` is the turn-0 rollout group, `answer_ids` the final attempts (one
  per choice, non-empty; a GIN index finds the served answer that holds an attempt), with the mode, the zero-shot
  fallback and why (`fallback`, NULL when none), the sampling settings and timings (JSON objects), the name of the
  API key (never the key) and whether it was streamed.
- `answer_feedback`: a reward and/or a verdict on one attempt (at least one of the two; a reward is finite), the
  gold answer it was graded against, and the key's name. Feedback is appended, never updated: the latest verdict of
  an attempt is its verdict.
- `experience_usage` reads an attempt's correctness as `coalesce(attempts.correct, its latest feedback verdict)`,
  for the uses and the zero-shot baselines alike (drop + create keeping the grants on it, as 0008 does; the same
  definition is in sql/views/experience_usage.sql).
- The serving role `lanpo_serve_<database>` (cut to 63 bytes with a hash, as 0004's reader), `LOGIN NOSUPERUSER
  NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS`, `statement_timeout = '30s'`, a random password in
  `lanpo_private.serve_login`. It may read what a request reads, insert what a request writes, update only the
  columns of `runs` a run's lifecycle and heartbeat write and `run_metrics.value` (an upsert), use the identity
  sequences lanpo reserves ids from, and take the per-dataset advisory lock (`pg_advisory_xact_lock(int, int)`)
  where 0004 revoked it from PUBLIC. Nothing else: no UPDATE or DELETE of lessons, attempts or problems, nothing
  in `lanpo_private`, no CREATE. Each grant is what a test running the server's calls as the role needs
  (tests/db/test_serving.py). What the migrating user may not run is kept in `serve_login.setup_sql`.

Downgrade drops the role (DROP OWNED BY first), its login, both tables and the runs of kind 'serve' (their
attempts with them), and restores 0008's view and the kind check.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

log = logging.getLogger("lanpo.migrations")

OLD_KINDS = ("train", "sft", "eval", "infer", "import", "bench")
KINDS = (*OLD_KINDS, "serve")

ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
ROLE_SETTINGS = {"statement_timeout": "'30s'"}

# table -> what the serving role may do on it (found by running the server's calls as the role).
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
}
# lanpo reserves ids from these with nextval() before a COPY (lanpo.db.repo.bulk.reserve_ids)
SEQUENCES = ("rollout_groups", "attempts")
# lanpo.db.repo.problems.upsert_problems takes the dataset's lock; 0004 revoked it from PUBLIC under a superuser
LOCK_FUNCTION = "pg_catalog.pg_advisory_xact_lock(integer, integer)"

EXPERIENCE_USAGE = """
CREATE OR REPLACE VIEW experience_usage AS
WITH verdicts AS (
    SELECT DISTINCT ON (f.attempt_id) f.attempt_id, f.correct
    FROM answer_feedback f
    WHERE f.correct IS NOT NULL
    ORDER BY f.attempt_id, f.created_at DESC, f.id DESC
),
zero_shot AS (
    SELECT g.run_id, g.step, g.problem_id, g.policy_version_id,
           avg(CAST(CAST(coalesce(a.correct, vd.correct) AS integer) AS double precision)) AS accuracy
    FROM attempts a
    JOIN rollout_groups g ON g.id = a.group_id
    LEFT JOIN verdicts vd ON vd.attempt_id = a.id
    WHERE g.mode = 'zero_shot' AND coalesce(a.correct, vd.correct) IS NOT NULL
    GROUP BY g.run_id, g.step, g.problem_id, g.policy_version_id
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) OVER (PARTITION BY gc.group_id) AS k
    FROM group_contexts gc
    WHERE gc.experience_version_id IS NOT NULL
),
uses AS (
    SELECT i.version_id, a.id AS attempt_id, g.problem_id, i.k,
           CAST(CAST(coalesce(a.correct, vd.correct) AS integer) AS double precision) AS correct,
           zs.accuracy AS baseline
    FROM items i
    JOIN rollout_groups g ON g.id = i.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN verdicts vd ON vd.attempt_id = a.id
    LEFT JOIN zero_shot zs
           ON zs.run_id = g.run_id AND zs.step = g.step AND zs.problem_id = g.problem_id
          AND zs.policy_version_id IS NOT DISTINCT FROM g.policy_version_id
)
SELECT v.id AS version_id, v.experience_id, v.version, e.pool_id, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       count(u.correct - u.baseline) AS uses_with_baseline,
       avg(u.correct) FILTER (WHERE u.baseline IS NOT NULL) AS accuracy_with,
       avg(u.baseline) FILTER (WHERE u.correct IS NOT NULL) AS zero_shot_accuracy,
       avg((u.correct - u.baseline) / u.k) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.pool_id, e.problem_id, e.evicted_at;
"""

# The 0008 definition, restored by downgrade (migrations are frozen: copied here on purpose).
OLD_EXPERIENCE_USAGE = """
CREATE OR REPLACE VIEW experience_usage AS
WITH zero_shot AS (
    SELECT g.run_id, g.step, g.problem_id, g.policy_version_id,
           avg(CAST(CAST(a.correct AS integer) AS double precision)) AS accuracy
    FROM attempts a
    JOIN rollout_groups g ON g.id = a.group_id
    WHERE g.mode = 'zero_shot' AND a.correct IS NOT NULL
    GROUP BY g.run_id, g.step, g.problem_id, g.policy_version_id
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) OVER (PARTITION BY gc.group_id) AS k
    FROM group_contexts gc
    WHERE gc.experience_version_id IS NOT NULL
),
uses AS (
    SELECT i.version_id, a.id AS attempt_id, g.problem_id, i.k,
           CAST(CAST(a.correct AS integer) AS double precision) AS correct, zs.accuracy AS baseline
    FROM items i
    JOIN rollout_groups g ON g.id = i.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN zero_shot zs
           ON zs.run_id = g.run_id AND zs.step = g.step AND zs.problem_id = g.problem_id
          AND zs.policy_version_id IS NOT DISTINCT FROM g.policy_version_id
)
SELECT v.id AS version_id, v.experience_id, v.version, e.pool_id, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       count(u.correct - u.baseline) AS uses_with_baseline,
       avg(u.correct) FILTER (WHERE u.baseline IS NOT NULL) AS accuracy_with,
       avg(u.baseline) FILTER (WHERE u.correct IS NOT NULL) AS zero_shot_accuracy,
       avg((u.correct - u.baseline) / u.k) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.pool_id, e.problem_id, e.evicted_at;
"""

# Who may do what on the view, besides its owner (grantee 0 is PUBLIC).
GRANTS = """
SELECT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee, acl.privilege_type
FROM pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) acl
LEFT JOIN pg_roles r ON r.oid = acl.grantee
WHERE c.oid = CAST('public.experience_usage' AS regclass) AND acl.grantee <> c.relowner
ORDER BY 1, 2
"""

ME = """
SELECT r.rolname, current_database() AS database, r.rolsuper, r.rolsuper OR r.rolcreaterole AS manages_roles,
       r.rolsuper OR d.datdba = r.oid AS owns_database,
       has_function_privilege('public', 'pg_catalog.pg_advisory_xact_lock(integer, integer)', 'EXECUTE') AS lock_public
FROM pg_roles r JOIN pg_database d ON d.datname = current_database() WHERE r.rolname = current_user
"""


def role_name(database: str) -> str:
    """`lanpo_serve_<database>`, cut to Postgres' 63-byte identifier limit with a hash to keep it unique."""
    name = f"lanpo_serve_{database}"
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha256(database.encode()).hexdigest()[:8]
    head = database.encode()[: 63 - len("lanpo_serve_") - len(digest) - 1].decode(errors="ignore")
    return f"lanpo_serve_{head}_{digest}"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _replace_view(ddl: str) -> None:
    """Drop experience_usage and create it from `ddl`, keeping the privileges granted on it."""
    grants = op.get_bind().execute(sa.text(GRANTS)).all()
    op.execute("DROP VIEW experience_usage")
    op.execute(ddl)
    for grantee, privilege in grants:
        op.execute(f"GRANT {privilege} ON experience_usage TO {grantee}")


def _kinds(kinds: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_runs_kind_valid"), "runs", type_="check")
    op.create_check_constraint(op.f("ck_runs_kind_valid"), "runs", f"kind IN ({', '.join(repr(k) for k in kinds)})")


def _tables() -> None:
    op.create_table(
        "served_answers",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("group_id", sa.BigInteger(), nullable=False),
        sa.Column("answer_ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("fallback", sa.Text(), nullable=True),
        sa.Column("sampling", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("timings", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("key_name", sa.Text(), nullable=True),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("length(btrim(request_id)) > 0", name=op.f("ck_served_answers_request_id_nonempty")),
        sa.CheckConstraint("cardinality(answer_ids) >= 1", name=op.f("ck_served_answers_answers_nonempty")),
        sa.CheckConstraint(
            "jsonb_typeof(sampling) = 'object' AND jsonb_typeof(timings) = 'object'",
            name=op.f("ck_served_answers_json_objects"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_served_answers_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["group_id"], ["rollout_groups.id"], name=op.f("fk_served_answers_group_id_rollout_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_served_answers")),
        sa.UniqueConstraint("request_id", name=op.f("uq_served_answers_request_id")),
    )  # fmt: skip
    op.create_index("ix_served_answers_run_id", "served_answers", ["run_id"])
    op.create_index("ix_served_answers_group_id", "served_answers", ["group_id"])
    # "which served answer holds attempt X": answer_ids @> ARRAY[X]
    op.create_index("ix_served_answers_answer_ids", "served_answers", ["answer_ids"], postgresql_using="gin")
    op.create_table(
        "answer_feedback",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("gold_answer", sa.Text(), nullable=True),
        sa.Column("key_name", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "reward IS NULL OR reward NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
            name=op.f("ck_answer_feedback_reward_finite"),
        ),
        sa.CheckConstraint("reward IS NOT NULL OR correct IS NOT NULL", name=op.f("ck_answer_feedback_has_outcome")),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_answer_feedback_attempt_id_attempts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_answer_feedback")),
    )
    op.create_index("ix_answer_feedback_attempt_created", "answer_feedback", ["attempt_id", "created_at"])


def _role() -> None:
    bind = op.get_bind()
    me = bind.execute(sa.text(ME)).one()
    role, owner = role_name(me.database), ident(me.rolname)
    password = secrets.token_urlsafe(32)
    exists = bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}) > 0
    op.execute(
        "CREATE TABLE lanpo_private.serve_login (role_name text PRIMARY KEY, password text NOT NULL, "
        "setup_sql text NOT NULL DEFAULT '', created_at timestamptz NOT NULL DEFAULT now())"
    )
    r = ident(role)
    # (statement, whether this user may run it); what it may not or cannot run is left for an administrator.
    steps = [
        (
            f"{'ALTER' if exists else 'CREATE'} ROLE {r} WITH {ROLE_ATTRIBUTES} PASSWORD {literal(password)}",
            me.manages_roles,
        ),
        *((f"ALTER ROLE {r} SET {k} = {v}", me.manages_roles) for k, v in ROLE_SETTINGS.items()),
        (f"GRANT USAGE ON SCHEMA public TO {r}", me.owns_database),
        *((f"GRANT {what} ON {table} TO {r}", True) for table, what in TABLE_GRANTS.items()),
        *(
            (f"GRANT USAGE ON SEQUENCE {ident(table + '_id_seq')} TO {r}", True)
            for table in SEQUENCES
        ),
    ]  # fmt: skip
    # 0004 revoked it from PUBLIC if its user was a superuser, or left the revoke to an administrator, who may run
    # it after this: a user that may not grant it leaves the grant to the administrator too
    if not me.lock_public or not me.rolsuper:
        steps.append((f"GRANT EXECUTE ON FUNCTION {LOCK_FUNCTION} TO {r}", me.rolsuper))
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
        sa.text("INSERT INTO lanpo_private.serve_login (role_name, password, setup_sql) VALUES (:r, :p, :s)"),
        {"r": role, "p": password, "s": "".join(f"{s};\n" for s in left)},
    )
    if left:
        log.warning(
            "the serving role %s is not fully set up: user %s may not run %d statement(s); "
            "`lanpo db serve-role` prints them for an administrator",
            role,
            owner,
            len(left),
        )


def upgrade() -> None:
    _kinds(KINDS)
    _tables()
    _replace_view(EXPERIENCE_USAGE)
    _role()


def downgrade() -> None:
    bind = op.get_bind()
    role = bind.scalar(sa.text("SELECT role_name FROM lanpo_private.serve_login"))
    if role and bind.scalar(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = :r"), {"r": role}):
        r = ident(role)
        # DROP OWNED BY needs membership in the role; a user without it revokes what it may instead.
        for statement in (
            f"DROP OWNED BY {r}",
            f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {r}",
            f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {r}",
            f"REVOKE ALL ON SCHEMA public FROM {r}",
            f"REVOKE EXECUTE ON FUNCTION {LOCK_FUNCTION} FROM {r}",
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
    op.execute("DROP TABLE lanpo_private.serve_login")
    _replace_view(OLD_EXPERIENCE_USAGE)
    op.drop_table("answer_feedback")
    op.drop_table("served_answers")
    served = bind.execute(sa.text("DELETE FROM runs WHERE kind = 'serve'")).rowcount
    if served:
        log.warning("dropped %d run(s) of kind 'serve' and their answers: 0013 knows no such kind", served)
    _kinds(OLD_KINDS)
