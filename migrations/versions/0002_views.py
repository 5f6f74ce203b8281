"""views of the experience history

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

pool_current, experience_history, run_rewards and experience_usage. The DDL is inline (migrations never
read sql/); the same definitions are kept for readers in sql/views/*.sql, and tests/db/test_views.py proves
the views in the database equal those files.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

POOL_CURRENT = """
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
"""

EXPERIENCE_HISTORY = """
CREATE OR REPLACE VIEW experience_history AS
SELECT e.id AS experience_id, e.problem_id, p.dataset, p.external_id, e.kind, e.reward, e.run_id, e.step,
       e.source_attempt_id, e.created_at AS experience_created_at, e.evicted_at, e.evicted_by,
       e.evicted_at IS NULL AS active, v.id AS version_id, v.version, v.summary, v.author, v.policy_version_id,
       v.prompt_version, v.created_at AS version_created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current
FROM experiences e
JOIN problems p ON p.id = e.problem_id
JOIN experience_versions v ON v.experience_id = e.id;
"""

RUN_REWARDS = """
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
"""

EXPERIENCE_USAGE = """
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
"""

VIEWS = {
    "pool_current": POOL_CURRENT,
    "experience_history": EXPERIENCE_HISTORY,
    "run_rewards": RUN_REWARDS,
    "experience_usage": EXPERIENCE_USAGE,
}


def upgrade() -> None:
    for ddl in VIEWS.values():
        op.execute(ddl)


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
