"""lesson effects: each lesson version's own effect, told apart from the lessons drawn beside it

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06

A use credits every item of its context an equal share of the context's gain (`lesson_uses.credit`, d / k), so
`credit / graded` mixes a lesson's effect with its neighbours': a lesson that does nothing, drawn beside one that
helps, earns half the helpful one's gain. From here each pool's graded uses go into one normal model, the gain of a
use the sum of its lessons' effects plus noise, each effect under a N(0, 0.15^2) prior (`lanpo.lesson_effects`,
docs/concepts.md "Usefulness per version"), and each version's row keeps what the fit says of it alone:
- `lesson_usefulness`: `net_credit` and `net_credit_var` (graded * lift and graded^2 * lift's variance: the
  evidence on the version's own effect with its partners integrated out; finite, the variance >= 0), written by
  every refresh for the pools it touches (`lanpo.db.repo.usefulness.fit_pools`); filled here for every pool. The
  serving role may update them (a verdict refits its lessons' pool).
- `lesson_history`: `lift`, `lift_low`, `lift_high` and `probation` read them (lift = net_credit / graded, its
  interval -+ 1.96 sqrt(net_credit_var) / graded), and the two columns come last. `credit` and `credit_var` stay,
  the shares as before (`credit / graded` is still `experience_usage.lift`).
- The statements that value a lesson (value-aware draws and retrieval, eviction by `lowest_utility`) and retire one
  (`store.retire_below`) read the new columns; `lanpo_lesson_value` is unchanged: under the fit's prior it gives
  back the fit's posterior mean and standard deviation.

Downgrade restores 0019's view (dropped and created again: its grants come back through 0004's default
privileges) and drops the columns; the statements of this revision's code then read columns that are gone.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

SERVE_ROLE = (
    "SELECT s.role_name FROM lanpo_private.serve_login s JOIN pg_catalog.pg_roles r ON r.rolname = s.role_name"
)
COLUMNS = ("net_credit", "net_credit_var")

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
       coalesce(u.credit, 0) AS credit, u.net_credit / CAST(nullif(u.graded, 0) AS double precision) AS lift,
       coalesce(u.credit_var, 0) AS credit_var,
       (u.net_credit - 1.96 * sqrt(u.net_credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_low,
       (u.net_credit + 1.96 * sqrt(u.net_credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_high,
       CASE WHEN e.evicted_by = 'retired:harmful' THEN 'retired'
            WHEN coalesce(u.graded, 0) = 0 THEN 'untried'
            WHEN (u.net_credit - 1.96 * sqrt(u.net_credit_var)) / CAST(u.graded AS double precision) > 0 THEN 'helps'
            WHEN (u.net_credit + 1.96 * sqrt(u.net_credit_var)) / CAST(u.graded AS double precision) < 0 THEN 'hurts'
            ELSE 'trying' END AS probation,
       coalesce(u.net_credit, 0) AS net_credit, coalesce(u.net_credit_var, 0) AS net_credit_var
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


def _grant() -> None:
    """The serving role may update the new columns (a verdict refits its lessons' pool); they go with their columns."""
    bind = op.get_bind()
    role = bind.scalar(sa.text(SERVE_ROLE))
    if role:
        quoted = bind.dialect.identifier_preparer.quote(role)
        op.execute(f"GRANT UPDATE ({', '.join(COLUMNS)}) ON lesson_usefulness TO {quoted}")


def _refit() -> None:
    """Every pool's lessons fitted from their graded uses, by the writers' own code."""
    from lanpo.db.repo import usefulness

    usefulness.refit(op.get_bind())


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("lesson_usefulness", sa.Column(name, sa.Double(), server_default="0", nullable=False))
    op.create_check_constraint(
        op.f("ck_lesson_usefulness_net_credit_finite"), "lesson_usefulness",
        "net_credit IS NULL OR net_credit NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
    )  # fmt: skip
    op.create_check_constraint(
        op.f("ck_lesson_usefulness_net_credit_var_valid"), "lesson_usefulness",
        "net_credit_var >= 0 AND net_credit_var < 'Infinity'",
    )  # fmt: skip
    _grant()
    _refit()
    op.execute(LESSON_HISTORY)


def downgrade() -> None:
    op.execute("DROP VIEW lesson_history")  # columns cannot be dropped by CREATE OR REPLACE
    op.execute(OLD_LESSON_HISTORY)
    for name in COLUMNS:
        op.drop_column("lesson_usefulness", name)
