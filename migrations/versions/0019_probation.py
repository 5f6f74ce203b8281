"""probation: each lesson version's state, read off its lift's interval and the lesson's retirement

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

`lesson_history` gave each version's lift with its 95 % interval (0018), and a reader had to work out from
`lift_low`, `lift_high`, `graded` and `evicted_by` whether a lesson is proven, still on trial or harmful. The view
now says so in one column, `probation`, on every version's row (docs/concepts.md, docs/sql.md):
- `retired`: the lesson was retired by its record (`evicted_by = 'retired:harmful'`), on every version's row;
- `untried`: no graded attempt yet (`graded = 0`), so no lift;
- `helps`: the interval lies above 0 (`lift_low > 0`);
- `hurts`: the interval lies below 0 (`lift_high < 0`) and nothing retired the lesson (among others: no
  `store.retire_below`, fewer than `store.min_uses` known uses, a bound below 0, a version no longer current, or
  evidence only `lanpo serve` wrote, which never retires);
- `trying`: the interval spans 0: on probation, the evidence says neither yet.
A lesson that left its pool for another reason (a cap, its age, a person) keeps its versions' evidence state;
`evicted_by` says why it left. Nothing is stored: the column is computed from `lesson_usefulness` as the interval
is, so every writer that keeps the record current keeps it current too.

The new column comes last, so upgrade replaces the view in place and its grants stay. Downgrade restores 0018's
view (lesson_history dropped and created again, as columns cannot be dropped by CREATE OR REPLACE: its grants come
back through 0004's default privileges).
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# the view at this revision; the same definition is in sql/views/ (tests/db/test_views.py)
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
       (u.credit + 1.96 * sqrt(u.credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_high,
       CASE WHEN e.evicted_by = 'retired:harmful' THEN 'retired'
            WHEN coalesce(u.graded, 0) = 0 THEN 'untried'
            WHEN (u.credit - 1.96 * sqrt(u.credit_var)) / CAST(u.graded AS double precision) > 0 THEN 'helps'
            WHEN (u.credit + 1.96 * sqrt(u.credit_var)) / CAST(u.graded AS double precision) < 0 THEN 'hurts'
            ELSE 'trying' END AS probation
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


def upgrade() -> None:
    op.execute(LESSON_HISTORY)


def downgrade() -> None:
    op.execute("DROP VIEW lesson_history")  # columns cannot be dropped by CREATE OR REPLACE
    op.execute(OLD_LESSON_HISTORY)
