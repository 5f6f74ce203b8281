"""usefulness known in training: an estimated zero-shot baseline for every use, and each use's variance

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

A training step draws each problem once, in one mode, so no use of a lesson in training had the same-step zero-shot
baseline its outcome needs (0 of 4 lesson uses known after `lanpo demo`). From here a use in a training run without
one gets an estimate from the run's zero-shot attempts at the few steps before its own
(sql/queries/usefulness_uses_recompute.sql, docs/concepts.md):
- `pools`: `baseline_half_life` (steps; 0: exact baselines only) and `baseline_prior` (the weight, in attempts, of
  all problems' zero-shot success as the prior of one problem's), both >= 0 and finite; every existing pool takes
  the defaults, 2 and 2; `retire_below` (NULL: never), a lift bound under which a lesson whose lift's 95 % interval
  lies entirely is retired as `retired:harmful` by the next training or evaluation write of its evidence.
- `lesson_uses`: `baseline` (the b its outcome and credit compare with), `baseline_n` (the attempts it is worth),
  `baseline_source` (`exact` | `estimated`; NULL with no baseline), `credit_var` (the variance of its credit).
- `lesson_usefulness`: `credit_var`, the sum of its uses'.
- `experience_usage` takes each use's baseline from `lesson_uses`, so `lift` stays `credit / graded`;
  `lesson_history` adds `credit_var` and lift's 95 % interval, `lift_low` and `lift_high`.
- Every use in the history is recomputed (a training use without a baseline may now have an estimate), and every
  version re-summed. The serving role may update the new columns (a verdict recomputes a use's row).

Downgrade makes the estimated uses unknown again (outcome NULL, nothing graded or credited: what 0015's estimator
gives them), re-sums the versions, drops the columns and restores the views (lesson_history dropped and created
again: its grants come back through 0004's default privileges).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

SERVE_ROLE = (
    "SELECT s.role_name FROM lanpo_private.serve_login s JOIN pg_catalog.pg_roles r ON r.rolname = s.role_name"
)
RANGE = "{0} >= 0 AND {0} < 'Infinity'"  # >= 0 and finite: Postgres orders NaN above Infinity

# the views at this revision; the same definitions are in sql/views/ (tests/db/test_views.py)
EXPERIENCE_USAGE = """
CREATE OR REPLACE VIEW experience_usage AS
WITH verdicts AS (
    SELECT DISTINCT ON (f.attempt_id) f.attempt_id, f.correct
    FROM answer_feedback f
    WHERE f.correct IS NOT NULL
    ORDER BY f.attempt_id, f.created_at DESC, f.id DESC
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) OVER (PARTITION BY gc.group_id) AS k
    FROM group_contexts gc
    WHERE gc.experience_version_id IS NOT NULL
),
uses AS (
    SELECT i.version_id, a.id AS attempt_id, g.problem_id, i.k,
           CAST(CAST(coalesce(a.correct, vd.correct) AS integer) AS double precision) AS correct,
           lu.baseline
    FROM items i
    JOIN rollout_groups g ON g.id = i.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN verdicts vd ON vd.attempt_id = a.id
    LEFT JOIN lesson_uses lu ON lu.version_id = i.version_id AND lu.group_id = i.group_id
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

LESSON_HISTORY = """
CREATE OR REPLACE VIEW lesson_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id AS source_problem_id, e.kind,
       v.id AS version_id, v.version, v.reason, v.similarity, v.summary, v.author, v.policy_version_id,
       pv.step AS policy_step, v.run_id, v.step, v.source_attempt_id, v.reward, v.created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current,
       e.evicted_at IS NULL AS active, e.evicted_by, e.evicted_at, e.evicted_run_id, e.evicted_step, e.evicted_note,
       coalesce(u.uses, 0) AS uses, coalesce(u.helped, 0) AS helped, coalesce(u.hurt, 0) AS hurt,
       coalesce(u.even, 0) AS even, coalesce(u.unknown, 0) AS unknown, coalesce(u.graded, 0) AS graded,
       coalesce(u.credit, 0) AS credit, u.credit / CAST(nullif(u.graded, 0) AS double precision) AS lift,
       coalesce(u.credit_var, 0) AS credit_var,
       (u.credit - 1.96 * sqrt(u.credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_low,
       (u.credit + 1.96 * sqrt(u.credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_high
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN experience_versions v ON v.experience_id = e.id
LEFT JOIN policy_versions pv ON pv.id = v.policy_version_id
LEFT JOIN lesson_usefulness u ON u.version_id = v.id;
"""

OLD_LESSON_HISTORY = """
CREATE OR REPLACE VIEW lesson_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id AS source_problem_id, e.kind,
       v.id AS version_id, v.version, v.reason, v.similarity, v.summary, v.author, v.policy_version_id,
       pv.step AS policy_step, v.run_id, v.step, v.source_attempt_id, v.reward, v.created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current,
       e.evicted_at IS NULL AS active, e.evicted_by, e.evicted_at, e.evicted_run_id, e.evicted_step, e.evicted_note,
       coalesce(u.uses, 0) AS uses, coalesce(u.helped, 0) AS helped, coalesce(u.hurt, 0) AS hurt,
       coalesce(u.even, 0) AS even, coalesce(u.unknown, 0) AS unknown, coalesce(u.graded, 0) AS graded,
       coalesce(u.credit, 0) AS credit, u.credit / CAST(nullif(u.graded, 0) AS double precision) AS lift
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN experience_versions v ON v.experience_id = e.id
LEFT JOIN policy_versions pv ON pv.id = v.policy_version_id
LEFT JOIN lesson_usefulness u ON u.version_id = v.id;
"""

OLD_EXPERIENCE_USAGE = """
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


def _grant() -> None:
    """The serving role may update the new columns (a verdict recomputes a use's row); they go with their columns."""
    bind = op.get_bind()
    role = bind.scalar(sa.text(SERVE_ROLE))
    if role:
        quoted = bind.dialect.identifier_preparer.quote(role)
        op.execute(f"GRANT UPDATE (baseline, baseline_n, baseline_source, credit_var) ON lesson_uses TO {quoted}")
        op.execute(f"GRANT UPDATE (credit_var) ON lesson_usefulness TO {quoted}")


def _refill() -> None:
    """Every use's row recomputed by the writers' statement (all keys at once), every used version re-summed."""
    from lanpo.db.repo import usefulness

    usefulness.rebuild(op.get_bind())


def upgrade() -> None:
    op.add_column("pools", sa.Column("baseline_half_life", sa.Double(), server_default="2", nullable=False))
    op.add_column("pools", sa.Column("baseline_prior", sa.Double(), server_default="2", nullable=False))
    op.add_column("pools", sa.Column("retire_below", sa.Double(), nullable=True))
    for name in ("baseline_half_life", "baseline_prior"):
        op.create_check_constraint(op.f(f"ck_pools_{name}_range"), "pools", RANGE.format(name))
    op.create_check_constraint(
        op.f("ck_pools_retire_below_range"), "pools",
        "retire_below IS NULL OR (retire_below > -1 AND retire_below <= 1)",
    )  # fmt: skip
    op.add_column("lesson_uses", sa.Column("baseline", sa.Double(), nullable=True))
    op.add_column("lesson_uses", sa.Column("baseline_n", sa.Double(), nullable=True))
    op.add_column("lesson_uses", sa.Column("baseline_source", sa.Text(), nullable=True))
    op.add_column("lesson_uses", sa.Column("credit_var", sa.Double(), server_default="0", nullable=False))
    op.add_column("lesson_usefulness", sa.Column("credit_var", sa.Double(), server_default="0", nullable=False))
    op.create_check_constraint(
        op.f("ck_lesson_uses_baseline_valid"), "lesson_uses",
        "(baseline_source IS NULL AND baseline IS NULL AND baseline_n IS NULL) OR (baseline_source IN ('exact', "
        "'estimated') AND baseline >= 0 AND baseline <= 1 AND baseline_n > 0)",
    )  # fmt: skip
    for table in ("lesson_uses", "lesson_usefulness"):
        op.create_check_constraint(op.f(f"ck_{table}_credit_var_valid"), table, RANGE.format("credit_var"))
    _grant()
    _refill()
    op.execute(EXPERIENCE_USAGE)
    op.execute(LESSON_HISTORY)


def downgrade() -> None:
    op.execute(OLD_EXPERIENCE_USAGE)
    op.execute("DROP VIEW lesson_history")  # columns cannot be dropped by CREATE OR REPLACE
    op.execute(OLD_LESSON_HISTORY)
    op.execute("UPDATE lesson_uses SET outcome = NULL, graded = 0, credit = 0 WHERE baseline_source = 'estimated'")
    op.execute(
        """
        UPDATE lesson_usefulness lu SET uses = s.uses, helped = s.helped, hurt = s.hurt, even = s.even,
               unknown = s.unknown, graded = s.graded, credit = s.credit, updated_at = now()
        FROM (SELECT v.version_id, count(u.group_id) AS uses,
                     count(*) FILTER (WHERE u.outcome > 0) AS helped,
                     count(*) FILTER (WHERE u.outcome < 0) AS hurt,
                     count(*) FILTER (WHERE u.outcome = 0) AS even,
                     count(u.group_id) FILTER (WHERE u.outcome IS NULL) AS unknown,
                     coalesce(sum(u.graded), 0) AS graded, coalesce(sum(u.credit), 0) AS credit
              FROM lesson_usefulness v LEFT JOIN lesson_uses u ON u.version_id = v.version_id
              GROUP BY v.version_id) s
        WHERE s.version_id = lu.version_id
        """
    )
    for name in ("baseline", "baseline_n", "baseline_source", "credit_var"):
        op.drop_column("lesson_uses", name)
    op.drop_column("lesson_usefulness", "credit_var")
    for name in ("baseline_half_life", "baseline_prior", "retire_below"):
        op.drop_column("pools", name)
