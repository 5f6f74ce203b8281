-- Retirement by usefulness: of the given lesson versions, those that are the current version of an active lesson of a
-- pool with retire_below set, with at least the pool's min_uses uses of a known outcome, and whose lift's 95 %
-- interval lies below retire_below ((net_credit + 1.96 * sqrt(net_credit_var)) / graded < retire_below: lift_high
-- of lesson_history, the co-drawn lessons integrated out, migration 0024): their lessons leave the pool as
-- 'retired:harmful', tied to :run_id and :step when the writer names them (a training step's: a resume's
-- rollback_evictions.sql brings them back with the step's uses). Their versions and lesson_usefulness rows stay.
-- Only the current version's record counts: a new version (a merge, a rewrite) starts a fresh one.
WITH given AS (
    SELECT DISTINCT v.experience_id
    FROM experience_versions v
    WHERE v.id = ANY(CAST(:version_ids AS bigint[]))
),
current_versions AS (
    SELECT DISTINCT ON (v.experience_id) v.experience_id, v.id AS version_id
    FROM given g
    JOIN experience_versions v ON v.experience_id = g.experience_id
    ORDER BY v.experience_id, v.version DESC
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = 'retired:harmful', evicted_run_id = :run_id, evicted_step = :step
FROM current_versions c
JOIN lesson_usefulness u ON u.version_id = c.version_id
WHERE e.id = c.experience_id AND e.evicted_at IS NULL
  AND c.version_id = ANY(CAST(:version_ids AS bigint[]))
  AND EXISTS (
      SELECT 1 FROM pools p
      WHERE p.id = e.pool_id AND p.retire_below IS NOT NULL AND u.helped + u.hurt + u.even >= p.min_uses
        AND u.graded > 0 AND (u.net_credit + 1.96 * sqrt(u.net_credit_var)) / u.graded < p.retire_below
  )
RETURNING e.id
