-- Expiry by policy age: retire the active lessons of pool :pool_id whose current version was written by a policy
-- version of run :run_id whose step is below :step - :max_policy_age, as 'expired:policy_age', tied to the run's
-- step (evicted_run_id, evicted_step: a resume's rollback_evictions.sql brings them back). Versions of other runs,
-- or without a policy version, never expire.
WITH current_versions AS (
    SELECT DISTINCT ON (v.experience_id) v.experience_id, v.policy_version_id
    FROM experiences e
    JOIN experience_versions v ON v.experience_id = e.id
    WHERE e.pool_id = :pool_id AND e.evicted_at IS NULL
    ORDER BY v.experience_id, v.version DESC
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = 'expired:policy_age', evicted_run_id = :run_id, evicted_step = :step
FROM current_versions c
JOIN policy_versions pv ON pv.id = c.policy_version_id
WHERE e.id = c.experience_id AND e.evicted_at IS NULL
  AND pv.run_id = :run_id AND pv.step < :step - :max_policy_age
RETURNING e.id
