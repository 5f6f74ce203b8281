"""meta-experiences (MEL): contrastive pairs, their diagnoses, replays, verdicts and NLL use

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

MEL (meta-experience learning) turns a GRPO group with both correct and incorrect rollouts into lessons. A
lesson is an experience of `kind = 'meta'` in the run's pool; what it came from is kept next to it:

- `meta_pairs`: one row per contrastive pair (y+, y-) the trainer diagnosed: both attempts, how responses were
  split into steps, the bifurcation step (1-based, in the negative's steps) and the shared-prefix length, who
  located it (the model, or the textual first-difference heuristic), the diagnosis text, and the group's success
  rate. When the diagnosis gave a lesson: its experience, the replay group (the problem re-attempted with the
  lesson in the prompt), the replay success rate, the validation rule and the verdict (validated | rejected). A
  rejected lesson stays in history: its experience is inserted already evicted (`evicted_by = 'mel:rejected'`).
- `meta_nll_uses`: a validated lesson trained into the weights (J = J_GRPO + lambda * J_NLL) at a step, on which
  target (the lesson text, or a successful replay trajectory) and with how many tokens.
- `rollout_groups.mode` gains `replay`: the replays are rollout groups whose `group_contexts` name the
  experience version they carried.
- Views `meta_experience_history` (pair -> lesson -> replays -> verdict -> NLL steps) and `meta_experience_yield`
  (per step of a MEL run: qualifying groups -> pairs -> candidates -> validated).

Everything cascades from attempts, experiences and runs, so a resumed run's rollback of uncommitted steps takes
its MEL rows with it. Downgrade drops the views and tables and deletes the replay groups.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MODES = "'zero_shot', 'intra', 'inter', 'self_correct', 'retrieval', 'val', 'replay'"
OLD_MODES = "'zero_shot', 'intra', 'inter', 'self_correct', 'retrieval', 'val'"

# --------------------------------------------------------------------------- views at this revision
# The same definitions live in sql/views/*.sql for readers; tests/db/test_views.py proves they are equal.

META_EXPERIENCE_HISTORY = """
CREATE OR REPLACE VIEW meta_experience_history AS
SELECT mp.id AS pair_id, mp.run_id, r.name AS run_name, mp.step, mp.problem_id, p.dataset, p.external_id,
       mp.positive_attempt_id, mp.negative_attempt_id, mp.step_split, mp.bifurcation_step, mp.shared_prefix_steps,
       mp.located_by, mp.diagnosis, mp.group_success_rate, mp.experience_id, rv.version_id, rv.meta_experience,
       mp.replay_group_id, rv.replays, rv.replay_successes, mp.replay_success_rate, mp.validation_rule, mp.verdict,
       e.id IS NOT NULL AND e.evicted_at IS NULL AS active, e.evicted_by, nll.nll_steps, nll.nll_tokens,
       mp.created_at
FROM meta_pairs mp
JOIN runs r ON r.id = mp.run_id
JOIN problems p ON p.id = mp.problem_id
LEFT JOIN experiences e ON e.id = mp.experience_id
LEFT JOIN LATERAL (
    SELECT gc.experience_version_id AS version_id, v.summary AS meta_experience,
           (SELECT count(*) FROM attempts a WHERE a.group_id = mp.replay_group_id) AS replays,
           (SELECT count(*) FROM attempts a WHERE a.group_id = mp.replay_group_id AND a.correct) AS replay_successes
    FROM group_contexts gc
    JOIN experience_versions v ON v.id = gc.experience_version_id
    WHERE gc.group_id = mp.replay_group_id
    ORDER BY gc.position
    LIMIT 1
) rv ON true
LEFT JOIN LATERAL (
    SELECT array_agg(u.step ORDER BY u.step) AS nll_steps, sum(u.tokens) AS nll_tokens
    FROM meta_nll_uses u
    WHERE u.experience_id = mp.experience_id
) nll ON true;
"""

META_EXPERIENCE_YIELD = """
CREATE OR REPLACE VIEW meta_experience_yield AS
WITH mel_steps AS (
    SELECT s.run_id, r.name AS run_name, s.step
    FROM run_steps s
    JOIN runs r ON r.id = s.run_id
    WHERE s.step >= 1 AND r.config ->> 'method' = 'mel'
),
mixed AS (
    SELECT m.run_id, m.step, count(*) AS qualifying_groups
    FROM (
        SELECT g.run_id, g.step
        FROM rollout_groups g
        JOIN attempts a ON a.group_id = g.id
        WHERE g.mode IN ('zero_shot', 'intra', 'inter')
        GROUP BY g.id, g.run_id, g.step
        HAVING bool_or(a.correct) AND bool_or(NOT a.correct)
    ) m
    GROUP BY m.run_id, m.step
),
pairs AS (
    SELECT run_id, step, count(*) AS pairs, count(experience_id) AS candidates,
           count(*) FILTER (WHERE verdict = 'validated') AS validated,
           count(*) FILTER (WHERE verdict = 'rejected') AS rejected,
           avg(replay_success_rate) AS replay_success_rate
    FROM meta_pairs
    GROUP BY run_id, step
),
uses AS (
    SELECT run_id, step, count(*) AS nll_examples, sum(tokens) AS nll_tokens
    FROM meta_nll_uses
    GROUP BY run_id, step
)
SELECT s.run_id, s.run_name, s.step, coalesce(m.qualifying_groups, 0) AS qualifying_groups,
       coalesce(p.pairs, 0) AS pairs, coalesce(p.candidates, 0) AS candidates,
       coalesce(p.validated, 0) AS validated, coalesce(p.rejected, 0) AS rejected,
       CAST(p.validated AS float8) / nullif(p.pairs, 0) AS validation_yield, p.replay_success_rate,
       coalesce(u.nll_examples, 0) AS nll_examples, coalesce(u.nll_tokens, 0) AS nll_tokens
FROM mel_steps s
LEFT JOIN mixed m ON m.run_id = s.run_id AND m.step = s.step
LEFT JOIN pairs p ON p.run_id = s.run_id AND p.step = s.step
LEFT JOIN uses u ON u.run_id = s.run_id AND u.step = s.step;
"""

VIEWS = {"meta_experience_history": META_EXPERIENCE_HISTORY, "meta_experience_yield": META_EXPERIENCE_YIELD}


def upgrade() -> None:
    op.drop_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", type_="check")
    op.create_check_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", f"mode IN ({MODES})")
    op.create_table(
        "meta_pairs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.BigInteger(), nullable=False),
        sa.Column("positive_attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("negative_attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("step_split", sa.Text(), nullable=False),
        sa.Column("bifurcation_step", sa.Integer(), nullable=False),
        sa.Column("shared_prefix_steps", sa.Integer(), nullable=False),
        sa.Column("located_by", sa.Text(), nullable=False),
        sa.Column("diagnosis", sa.Text(), nullable=False),
        sa.Column("prompt_version", sa.Text(), nullable=True),
        sa.Column("group_success_rate", sa.Double(), nullable=False),
        sa.Column("experience_id", sa.BigInteger(), nullable=True),
        sa.Column("replay_group_id", sa.BigInteger(), nullable=True),
        sa.Column("replay_success_rate", sa.Double(), nullable=True),
        sa.Column("validation_rule", sa.Text(), nullable=True),
        sa.Column("verdict", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("step >= 0", name=op.f("ck_meta_pairs_step_nonnegative")),
        sa.CheckConstraint("bifurcation_step >= 1", name=op.f("ck_meta_pairs_bifurcation_positive")),
        sa.CheckConstraint("shared_prefix_steps >= 0", name=op.f("ck_meta_pairs_shared_prefix_nonnegative")),
        sa.CheckConstraint("step_split IN ('lines', 'sentences')", name=op.f("ck_meta_pairs_step_split_valid")),
        sa.CheckConstraint("located_by IN ('model', 'heuristic')", name=op.f("ck_meta_pairs_located_by_valid")),
        sa.CheckConstraint("verdict IN ('validated', 'rejected')", name=op.f("ck_meta_pairs_verdict_valid")),
        sa.CheckConstraint(
            "group_success_rate >= 0 AND group_success_rate <= 1", name=op.f("ck_meta_pairs_group_rate_unit")
        ),
        sa.CheckConstraint(
            "replay_success_rate >= 0 AND replay_success_rate <= 1", name=op.f("ck_meta_pairs_replay_rate_unit")
        ),
        sa.CheckConstraint("positive_attempt_id <> negative_attempt_id", name=op.f("ck_meta_pairs_two_attempts")),
        sa.CheckConstraint(
            "num_nulls(experience_id, replay_group_id, replay_success_rate, validation_rule, verdict) IN (0, 5)",
            name=op.f("ck_meta_pairs_candidate_complete"),
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_meta_pairs_run_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["problem_id"], ["problems.id"], name=op.f("fk_meta_pairs_problem_id_problems"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["positive_attempt_id"],
            ["attempts.id"],
            name=op.f("fk_meta_pairs_positive_attempt_id_attempts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["negative_attempt_id"],
            ["attempts.id"],
            name=op.f("fk_meta_pairs_negative_attempt_id_attempts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["experience_id"],
            ["experiences.id"],
            name=op.f("fk_meta_pairs_experience_id_experiences"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["replay_group_id"],
            ["rollout_groups.id"],
            name=op.f("fk_meta_pairs_replay_group_id_rollout_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_meta_pairs")),
        sa.UniqueConstraint("experience_id", name=op.f("uq_meta_pairs_experience_id")),
        sa.UniqueConstraint("replay_group_id", name=op.f("uq_meta_pairs_replay_group_id")),
    )
    op.create_index("ix_meta_pairs_run_step", "meta_pairs", ["run_id", "step"], unique=False)
    op.create_index("ix_meta_pairs_positive_attempt_id", "meta_pairs", ["positive_attempt_id"], unique=False)
    op.create_index("ix_meta_pairs_negative_attempt_id", "meta_pairs", ["negative_attempt_id"], unique=False)
    op.create_table(
        "meta_nll_uses",
        sa.Column("experience_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("step >= 0", name=op.f("ck_meta_nll_uses_step_nonnegative")),
        sa.CheckConstraint("tokens >= 1", name=op.f("ck_meta_nll_uses_tokens_positive")),
        sa.CheckConstraint("target IN ('lesson', 'replay')", name=op.f("ck_meta_nll_uses_target_valid")),
        sa.CheckConstraint(
            "(target = 'replay') = (attempt_id IS NOT NULL)", name=op.f("ck_meta_nll_uses_replay_names_attempt")
        ),
        sa.ForeignKeyConstraint(
            ["experience_id"],
            ["experiences.id"],
            name=op.f("fk_meta_nll_uses_experience_id_experiences"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_meta_nll_uses_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_meta_nll_uses_attempt_id_attempts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("experience_id", "run_id", "step", name=op.f("pk_meta_nll_uses")),
    )
    op.create_index("ix_meta_nll_uses_run_step", "meta_nll_uses", ["run_id", "step"], unique=False)
    for ddl in VIEWS.values():
        op.execute(ddl)


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("meta_nll_uses")
    op.drop_table("meta_pairs")
    op.execute("DELETE FROM rollout_groups WHERE mode = 'replay'")  # their attempts and contexts cascade
    op.drop_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", type_="check")
    op.create_check_constraint(op.f("ck_rollout_groups_mode_valid"), "rollout_groups", f"mode IN ({OLD_MODES})")
