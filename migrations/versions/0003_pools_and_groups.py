"""named pools, prompts stored once per rollout group

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

- `pools`: a named experience pool with its capacity settings. Every experience belongs to one pool; a run
  reads and writes its own (`runs.pool_id`). Existing experiences move into one pool per run (named after the
  run, with the caps its config recorded, else the defaults); experiences without a run go to pool `default`.
- `rollout_groups`: one prompt and the rollouts generated from it. The prompt text, its template version,
  token count, run, step, problem, policy version and mode are stored once per group instead of once per
  attempt, and the feedback context moves from `attempt_contexts` (one row per attempt and item) to
  `group_contexts` (one row per group and item). Existing attempts are grouped by everything they shared.
- `attempts` keep the response and its grade, plus the sha256 of the adapter that served them.
- Large text columns use lz4 TOAST compression where the server was built with it (else pglz stays).
- The views are rebuilt on the new tables (`run_attempts` is new: attempts with their group's columns).

Downgrade restores the 0002 schema: per-attempt prompts and contexts are written back from the groups.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

VIEW_NAMES = ("pool_current", "experience_history", "run_rewards", "experience_usage", "run_attempts")

# --------------------------------------------------------------------------- views at this revision
# The same definitions live in sql/views/*.sql for readers; tests/db/test_views.py proves they are equal.

POOL_CURRENT = """
CREATE OR REPLACE VIEW pool_current AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id, p.dataset, p.external_id, e.kind, e.reward,
       e.run_id, e.step, e.source_attempt_id, e.created_at, v.id AS version_id, v.version, v.summary, v.author
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN problems p ON p.id = e.problem_id
CROSS JOIN LATERAL (
    SELECT ev.id, ev.version, ev.summary, ev.author
    FROM experience_versions ev
    WHERE ev.experience_id = e.id
    ORDER BY ev.version DESC
    LIMIT 1
) v
WHERE e.evicted_at IS NULL;
"""

EXPERIENCE_HISTORY = """
CREATE OR REPLACE VIEW experience_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id, p.dataset, p.external_id, e.kind, e.reward,
       e.run_id, e.step, e.source_attempt_id, e.created_at AS experience_created_at, e.evicted_at, e.evicted_by,
       e.evicted_at IS NULL AS active, v.id AS version_id, v.version, v.summary, v.author, v.policy_version_id,
       v.prompt_version, v.created_at AS version_created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN problems p ON p.id = e.problem_id
JOIN experience_versions v ON v.experience_id = e.id;
"""

RUN_REWARDS = """
CREATE OR REPLACE VIEW run_rewards AS
SELECT g.run_id, r.name AS run_name, g.step,
       CASE WHEN GROUPING(g.mode) = 1 THEN 'all' ELSE g.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN runs r ON r.id = g.run_id
GROUP BY GROUPING SETS ((g.run_id, r.name, g.step, g.mode), (g.run_id, r.name, g.step));
"""

EXPERIENCE_USAGE = """
CREATE OR REPLACE VIEW experience_usage AS
WITH zero_shot AS (
    SELECT g.problem_id, avg(a.reward) AS reward
    FROM attempts a
    JOIN rollout_groups g ON g.id = a.group_id
    WHERE g.mode = 'zero_shot' AND a.reward IS NOT NULL
    GROUP BY g.problem_id
),
uses AS (
    SELECT gc.experience_version_id AS version_id, a.id AS attempt_id, g.problem_id, a.reward,
           zs.reward AS zero_shot_reward
    FROM group_contexts gc
    JOIN rollout_groups g ON g.id = gc.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN zero_shot zs ON zs.problem_id = g.problem_id
    WHERE gc.experience_version_id IS NOT NULL
)
SELECT v.id AS version_id, v.experience_id, v.version, e.pool_id, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       avg(u.reward) AS mean_reward_with,
       avg(u.zero_shot_reward) AS zero_shot_mean_reward,
       avg(u.reward - u.zero_shot_reward) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.pool_id, e.problem_id, e.evicted_at;
"""

RUN_ATTEMPTS = """
CREATE OR REPLACE VIEW run_attempts AS
SELECT a.id AS attempt_id, a.group_id, g.run_id, r.name AS run_name, g.step, g.problem_id, p.dataset,
       p.external_id, g.mode, g.prompt_version, g.policy_version_id, a.served_adapter_sha256, a.response,
       a.reward, a.correct, a.format_ok, g.prompt_tokens, a.completion_tokens, a.created_at
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN problems p ON p.id = g.problem_id
LEFT JOIN runs r ON r.id = g.run_id;
"""

VIEWS = {
    "pool_current": POOL_CURRENT,
    "experience_history": EXPERIENCE_HISTORY,
    "run_rewards": RUN_REWARDS,
    "experience_usage": EXPERIENCE_USAGE,
    "run_attempts": RUN_ATTEMPTS,
}

# The 0002 definitions, restored by downgrade (migrations are frozen: copied here on purpose).
OLD_VIEWS = {
    "pool_current": """
CREATE OR REPLACE VIEW pool_current AS
SELECT e.id AS experience_id, e.problem_id, p.dataset, p.external_id, e.kind, e.reward, e.run_id, e.step,
       e.source_attempt_id, e.created_at, v.id AS version_id, v.version, v.summary, v.author
FROM experiences e
JOIN problems p ON p.id = e.problem_id
CROSS JOIN LATERAL (
    SELECT ev.id, ev.version, ev.summary, ev.author
    FROM experience_versions ev
    WHERE ev.experience_id = e.id
    ORDER BY ev.version DESC
    LIMIT 1
) v
WHERE e.evicted_at IS NULL;
""",
    "experience_history": """
CREATE OR REPLACE VIEW experience_history AS
SELECT e.id AS experience_id, e.problem_id, p.dataset, p.external_id, e.kind, e.reward, e.run_id, e.step,
       e.source_attempt_id, e.created_at AS experience_created_at, e.evicted_at, e.evicted_by,
       e.evicted_at IS NULL AS active, v.id AS version_id, v.version, v.summary, v.author, v.policy_version_id,
       v.prompt_version, v.created_at AS version_created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current
FROM experiences e
JOIN problems p ON p.id = e.problem_id
JOIN experience_versions v ON v.experience_id = e.id;
""",
    "run_rewards": """
CREATE OR REPLACE VIEW run_rewards AS
SELECT a.run_id, r.name AS run_name, a.step,
       CASE WHEN GROUPING(a.mode) = 1 THEN 'all' ELSE a.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN runs r ON r.id = a.run_id
GROUP BY GROUPING SETS ((a.run_id, r.name, a.step, a.mode), (a.run_id, r.name, a.step));
""",
    "experience_usage": """
CREATE OR REPLACE VIEW experience_usage AS
WITH zero_shot AS (
    SELECT problem_id, avg(reward) AS reward
    FROM attempts
    WHERE mode = 'zero_shot' AND reward IS NOT NULL
    GROUP BY problem_id
),
uses AS (
    SELECT ac.experience_version_id AS version_id, a.id AS attempt_id, a.problem_id, a.reward,
           zs.reward AS zero_shot_reward
    FROM attempt_contexts ac
    JOIN attempts a ON a.id = ac.attempt_id
    LEFT JOIN zero_shot zs ON zs.problem_id = a.problem_id
    WHERE ac.experience_version_id IS NOT NULL
)
SELECT v.id AS version_id, v.experience_id, v.version, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       avg(u.reward) AS mean_reward_with,
       avg(u.zero_shot_reward) AS zero_shot_mean_reward,
       avg(u.reward - u.zero_shot_reward) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.problem_id, e.evicted_at;
""",
}

# lz4 where the server has it (Postgres >= 14 built --with-lz4); otherwise the columns keep pglz.
COMPRESSION = """
DO $$
BEGIN
    ALTER TABLE rollout_groups ALTER COLUMN prompt SET COMPRESSION lz4;
    ALTER TABLE attempts ALTER COLUMN response SET COMPRESSION lz4;
    ALTER TABLE experience_versions ALTER COLUMN summary SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this Postgres has no lz4: large text columns keep the default (pglz) compression';
END $$;
"""

MODES = "'zero_shot', 'intra', 'inter', 'self_correct', 'retrieval', 'val'"
OLD_MODES = "'zero_shot', 'intra', 'inter', 'self_correct', 'retrieval'"


def _drop_views(names: tuple[str, ...] | list[str]) -> None:
    for name in names:
        op.execute(f"DROP VIEW IF EXISTS {name}")


def _identity_to_max(table: str) -> None:
    next_id = f"coalesce((SELECT max(id) FROM {table}), 0) + 1"
    op.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {next_id}, false)")


def upgrade() -> None:
    _drop_views(VIEW_NAMES)

    # ------------------------------------------------------------------ pools
    op.create_table(
        "pools",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("per_problem_cap", sa.Integer(), nullable=False),
        sa.Column("per_step_cap", sa.Integer(), nullable=False),
        sa.Column("global_cap", sa.Integer(), nullable=True),
        sa.Column("eviction", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("length(btrim(name)) > 0", name=op.f("ck_pools_name_nonempty")),
        sa.CheckConstraint("per_problem_cap >= 1", name=op.f("ck_pools_per_problem_cap_positive")),
        sa.CheckConstraint("per_step_cap >= 1", name=op.f("ck_pools_per_step_cap_positive")),
        sa.CheckConstraint("global_cap IS NULL OR global_cap >= 1", name=op.f("ck_pools_global_cap_positive")),
        sa.CheckConstraint(
            "eviction IN ('oldest', 'lowest_reward', 'lowest_relevance')", name=op.f("ck_pools_eviction_valid")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
        sa.UniqueConstraint("name", name=op.f("uq_pools_name")),
    )
    # One pool per run that wrote experiences, with the caps its config recorded (else the defaults).
    op.execute(
        """
        INSERT INTO pools (name, per_problem_cap, per_step_cap, global_cap, eviction, created_at)
        SELECT r.name,
               coalesce(CAST(r.config #>> '{store,per_problem_cap}' AS integer), 32),
               coalesce(CAST(r.config #>> '{store,per_step_cap}' AS integer), 8),
               CAST(r.config #>> '{store,global_cap}' AS integer),
               coalesce(r.config #>> '{store,eviction}', 'oldest'),
               r.started_at
        FROM runs r
        WHERE EXISTS (SELECT 1 FROM experiences e WHERE e.run_id = r.id)
        ORDER BY r.id
        """
    )
    # Experiences of no run share one pool (merged into a run's pool only if that run is named 'default').
    op.execute(
        """
        INSERT INTO pools (name, per_problem_cap, per_step_cap, global_cap, eviction)
        SELECT 'default', 32, 8, NULL, 'oldest'
        WHERE EXISTS (SELECT 1 FROM experiences WHERE run_id IS NULL)
        ON CONFLICT (name) DO NOTHING
        """
    )
    op.add_column("runs", sa.Column("pool_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(op.f("fk_runs_pool_id_pools"), "runs", "pools", ["pool_id"], ["id"])
    op.execute("UPDATE runs r SET pool_id = pl.id FROM pools pl WHERE pl.name = r.name")

    op.add_column("experiences", sa.Column("pool_id", sa.BigInteger(), nullable=True))
    op.execute(
        """
        UPDATE experiences e
        SET pool_id = pl.id
        FROM pools pl
        WHERE pl.name = coalesce((SELECT r.name FROM runs r WHERE r.id = e.run_id), 'default')
        """
    )
    op.alter_column("experiences", "pool_id", nullable=False)
    op.create_foreign_key(op.f("fk_experiences_pool_id_pools"), "experiences", "pools", ["pool_id"], ["id"])
    op.drop_index("ix_experiences_pool", table_name="experiences")
    op.drop_index("ix_experiences_active_created", table_name="experiences")
    op.create_index(
        "ix_experiences_active",
        "experiences",
        ["pool_id", "problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )
    op.create_index(
        "ix_experiences_active_created",
        "experiences",
        ["pool_id", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )

    # ------------------------------------------------------------------ rollout groups
    op.create_table(
        "rollout_groups",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("problem_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("policy_version_id", sa.BigInteger(), nullable=True),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("prompt_version", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(f"mode IN ({MODES})", name=op.f("ck_rollout_groups_mode_valid")),
        sa.CheckConstraint("step IS NULL OR step >= 0", name=op.f("ck_rollout_groups_step_nonnegative")),
        sa.CheckConstraint(
            "prompt_tokens IS NULL OR prompt_tokens >= 0", name=op.f("ck_rollout_groups_prompt_tokens_nonnegative")
        ),
        sa.ForeignKeyConstraint(
            ["policy_version_id"],
            ["policy_versions.id"],
            name=op.f("fk_rollout_groups_policy_version_id_policy_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name=op.f("fk_rollout_groups_problem_id_problems"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_rollout_groups_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_groups")),
    )
    op.create_table(
        "group_contexts",
        sa.Column("group_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("experience_version_id", sa.BigInteger(), nullable=True),
        sa.Column("context_attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "num_nonnulls(experience_version_id, context_attempt_id) = 1", name=op.f("ck_group_contexts_one_source")
        ),
        sa.CheckConstraint("position >= 0", name=op.f("ck_group_contexts_position_nonnegative")),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["rollout_groups.id"],
            name=op.f("fk_group_contexts_group_id_rollout_groups"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["context_attempt_id"], ["attempts.id"], name=op.f("fk_group_contexts_context_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(
            ["experience_version_id"],
            ["experience_versions.id"],
            name=op.f("fk_group_contexts_experience_version_id_experience_versions"),
        ),
        sa.PrimaryKeyConstraint("group_id", "position", name=op.f("pk_group_contexts")),
    )

    # Existing attempts: those that shared run, step, problem, policy version, mode, prompt, template and
    # context form one group, identified by its smallest attempt id.
    op.execute(
        """
        CREATE TEMP TABLE lanpo_attempt_group ON COMMIT DROP AS
        WITH keyed AS (
            SELECT a.*, coalesce((
                SELECT string_agg(concat_ws(':', c.position, c.experience_version_id, c.context_attempt_id,
                                            c.score), ',' ORDER BY c.position)
                FROM attempt_contexts c WHERE c.attempt_id = a.id), '') AS context_key
            FROM attempts a
        )
        SELECT id AS attempt_id, min(id) OVER (
                   PARTITION BY run_id, step, problem_id, policy_version_id, mode, prompt, prompt_version, context_key
               ) AS group_id
        FROM keyed
        """
    )
    op.execute(
        """
        INSERT INTO rollout_groups (id, run_id, problem_id, step, policy_version_id, mode, prompt, prompt_version,
                                    prompt_tokens, created_at)
        SELECT a.id, a.run_id, a.problem_id, a.step, a.policy_version_id, a.mode, a.prompt, a.prompt_version,
               a.prompt_tokens, a.created_at
        FROM attempts a
        JOIN lanpo_attempt_group ag ON ag.attempt_id = a.id AND ag.group_id = a.id
        """
    )
    _identity_to_max("rollout_groups")
    op.execute(
        """
        INSERT INTO group_contexts (group_id, position, experience_version_id, context_attempt_id, score)
        SELECT c.attempt_id, c.position, c.experience_version_id, c.context_attempt_id, c.score
        FROM attempt_contexts c
        JOIN lanpo_attempt_group ag ON ag.attempt_id = c.attempt_id AND ag.group_id = c.attempt_id
        """
    )
    op.add_column("attempts", sa.Column("group_id", sa.BigInteger(), nullable=True))
    op.add_column("attempts", sa.Column("served_adapter_sha256", sa.Text(), nullable=True))
    op.execute("UPDATE attempts a SET group_id = ag.group_id FROM lanpo_attempt_group ag WHERE ag.attempt_id = a.id")
    op.execute("DROP TABLE lanpo_attempt_group")
    op.alter_column("attempts", "group_id", nullable=False)
    op.create_foreign_key(
        op.f("fk_attempts_group_id_rollout_groups"), "attempts", "rollout_groups", ["group_id"], ["id"],
        ondelete="CASCADE",
    )  # fmt: skip
    op.create_check_constraint(
        op.f("ck_attempts_served_sha256_hex"),
        "attempts",
        "served_adapter_sha256 IS NULL OR served_adapter_sha256 ~ '^[0-9a-f]{64}$'",
    )
    op.drop_table("attempt_contexts")
    op.drop_index("ix_attempts_problem_recent", table_name="attempts")
    op.drop_index("ix_attempts_run_step", table_name="attempts")
    for column in ("run_id", "problem_id", "step", "policy_version_id", "mode", "prompt", "prompt_version"):
        op.drop_column("attempts", column)  # their constraints and foreign keys go with them
    op.drop_column("attempts", "prompt_tokens")
    op.create_index("ix_attempts_group_id", "attempts", ["group_id", "id"], unique=False)
    op.create_index(
        "ix_rollout_groups_problem_recent",
        "rollout_groups",
        ["problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
    )
    op.create_index("ix_rollout_groups_run_step", "rollout_groups", ["run_id", "step"], unique=False)
    op.create_index(
        "ix_group_contexts_experience_version_id", "group_contexts", ["experience_version_id"], unique=False
    )
    op.create_index("ix_group_contexts_context_attempt_id", "group_contexts", ["context_attempt_id"], unique=False)
    op.execute(COMPRESSION)
    for ddl in VIEWS.values():
        op.execute(ddl)


def downgrade() -> None:
    _drop_views(VIEW_NAMES)
    op.drop_index("ix_attempts_group_id", table_name="attempts")
    op.add_column("attempts", sa.Column("run_id", sa.BigInteger(), nullable=True))
    op.add_column("attempts", sa.Column("problem_id", sa.BigInteger(), nullable=True))
    op.add_column("attempts", sa.Column("step", sa.Integer(), nullable=True))
    op.add_column("attempts", sa.Column("policy_version_id", sa.BigInteger(), nullable=True))
    op.add_column("attempts", sa.Column("mode", sa.Text(), nullable=True))
    op.add_column("attempts", sa.Column("prompt", sa.Text(), nullable=True))
    op.add_column("attempts", sa.Column("prompt_version", sa.Text(), nullable=True))
    op.add_column("attempts", sa.Column("prompt_tokens", sa.Integer(), nullable=True))
    op.execute(
        """
        UPDATE attempts a
        SET run_id = g.run_id, problem_id = g.problem_id, step = g.step, policy_version_id = g.policy_version_id,
            mode = g.mode, prompt = g.prompt, prompt_version = g.prompt_version, prompt_tokens = g.prompt_tokens
        FROM rollout_groups g
        WHERE g.id = a.group_id
        """
    )
    # 'val' attempts do not exist before this revision.
    op.execute("DELETE FROM attempts WHERE mode = 'val'")
    for column in ("problem_id", "mode", "prompt"):
        op.alter_column("attempts", column, nullable=False)
    op.create_check_constraint(op.f("ck_attempts_mode_valid"), "attempts", f"mode IN ({OLD_MODES})")
    op.create_check_constraint(
        op.f("ck_attempts_prompt_tokens_nonnegative"), "attempts", "prompt_tokens IS NULL OR prompt_tokens >= 0"
    )
    op.create_foreign_key(
        op.f("fk_attempts_policy_version_id_policy_versions"), "attempts", "policy_versions", ["policy_version_id"],
        ["id"],
    )  # fmt: skip
    op.create_foreign_key(
        op.f("fk_attempts_problem_id_problems"), "attempts", "problems", ["problem_id"], ["id"], ondelete="CASCADE"
    )
    op.create_foreign_key(op.f("fk_attempts_run_id_runs"), "attempts", "runs", ["run_id"], ["id"], ondelete="CASCADE")
    op.create_index(
        "ix_attempts_problem_recent",
        "attempts",
        ["problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
    )
    op.create_index("ix_attempts_run_step", "attempts", ["run_id", "step"], unique=False)
    op.create_table(
        "attempt_contexts",
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("experience_version_id", sa.BigInteger(), nullable=True),
        sa.Column("context_attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("score", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "num_nonnulls(experience_version_id, context_attempt_id) = 1", name=op.f("ck_attempt_contexts_one_source")
        ),
        sa.CheckConstraint("position >= 0", name=op.f("ck_attempt_contexts_position_nonnegative")),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_attempt_contexts_attempt_id_attempts"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["context_attempt_id"], ["attempts.id"], name=op.f("fk_attempt_contexts_context_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(
            ["experience_version_id"],
            ["experience_versions.id"],
            name=op.f("fk_attempt_contexts_experience_version_id_experience_versions"),
        ),
        sa.PrimaryKeyConstraint("attempt_id", "position", name=op.f("pk_attempt_contexts")),
    )
    op.create_index(
        "ix_attempt_contexts_experience_version_id", "attempt_contexts", ["experience_version_id"], unique=False
    )
    op.execute(
        """
        INSERT INTO attempt_contexts (attempt_id, position, experience_version_id, context_attempt_id, score)
        SELECT a.id, c.position, c.experience_version_id, c.context_attempt_id, c.score
        FROM group_contexts c
        JOIN attempts a ON a.group_id = c.group_id
        """
    )
    op.drop_constraint(op.f("ck_attempts_served_sha256_hex"), "attempts", type_="check")
    op.drop_column("attempts", "served_adapter_sha256")
    op.drop_column("attempts", "group_id")  # its foreign key goes with it
    op.drop_table("group_contexts")
    op.drop_table("rollout_groups")

    op.drop_index("ix_experiences_active_created", table_name="experiences")
    op.drop_index("ix_experiences_active", table_name="experiences")
    op.drop_column("experiences", "pool_id")
    op.drop_column("runs", "pool_id")
    op.drop_table("pools")
    op.create_index(
        "ix_experiences_active_created",
        "experiences",
        ["created_at", "id"],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )
    op.create_index(
        "ix_experiences_pool",
        "experiences",
        ["problem_id", sa.literal_column("created_at DESC"), sa.literal_column("id DESC")],
        unique=False,
        postgresql_where=sa.text("evicted_at IS NULL"),
    )
    for ddl in OLD_VIEWS.values():
        op.execute(ddl)
