"""experience_usage: lift from correctness against a same-run, same-step zero-shot baseline, shared per context

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

The 0002/0003 view compared rewards, which hold the 0.1 format bonus a zero-shot attempt cannot earn; took its
zero-shot baseline from every run, step, policy version and evaluation of the problem at once; and credited the
whole result of a context of k experiences to each of the k. It is rebuilt:

- correctness (`attempts.correct`), not reward;
- the baseline of an attempt is the zero-shot attempts on the same problem in the same run at the same step and
  policy version, and an attempt without them has none;
- a context's gain is shared: each of its k items is credited gain / k;
- columns `mean_reward_with` and `zero_shot_mean_reward` become `accuracy_with` and `zero_shot_accuracy` (means
  over the uses with a baseline), and `uses_with_baseline` is new: a column's meaning changed, so its name did.

The column list changes, so the view is dropped and created (CREATE OR REPLACE cannot rename a column); the
privileges granted on it (the read-only role's SELECT) are read before the drop and granted again. The same
definition lives in sql/views/experience_usage.sql for readers; tests/db/test_views.py proves they are equal.
Downgrade restores the 0003 definition the same way.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

EXPERIENCE_USAGE = """
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

# The 0003 definition, restored by downgrade (migrations are frozen: copied here on purpose).
OLD_EXPERIENCE_USAGE = """
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

# Who may do what on the view, besides its owner (grantee 0 is PUBLIC).
GRANTS = """
SELECT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS grantee, acl.privilege_type
FROM pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) acl
LEFT JOIN pg_roles r ON r.oid = acl.grantee
WHERE c.oid = CAST('public.experience_usage' AS regclass) AND acl.grantee <> c.relowner
ORDER BY 1, 2
"""


def _replace_view(ddl: str) -> None:
    """Drop experience_usage and create it from `ddl`, keeping the privileges granted on it."""
    grants = op.get_bind().execute(sa.text(GRANTS)).all()
    op.execute("DROP VIEW experience_usage")
    op.execute(ddl)
    for grantee, privilege in grants:
        op.execute(f"GRANT {privilege} ON experience_usage TO {grantee}")


def upgrade() -> None:
    _replace_view(EXPERIENCE_USAGE)


def downgrade() -> None:
    _replace_view(OLD_EXPERIENCE_USAGE)
