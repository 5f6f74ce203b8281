-- Global cap: evict the worst active experiences of the whole pool until at most :cap remain.
-- Worst-first order by :policy as in evict_per_problem.sql (oldest, lowest reward, lowest relevance).
-- Call it holding the lock of lock_global_cap.sql.
WITH excess AS (
    SELECT greatest(count(*) - :cap, 0) AS n FROM experiences WHERE evicted_at IS NULL
),
victims AS (
    SELECT e.id
    FROM experiences e
    WHERE e.evicted_at IS NULL
    ORDER BY
        CASE :policy
            WHEN 'lowest_reward' THEN e.reward
            WHEN 'lowest_relevance' THEN COALESCE(
                (SELECT avg(rs.score) FROM relevance_scores rs
                 JOIN experience_versions v ON v.id = rs.candidate_version_id
                 WHERE v.experience_id = e.id),
                (SELECT avg(rs.score) FROM relevance_scores rs WHERE rs.candidate_problem_id = e.problem_id),
                0)
        END ASC NULLS FIRST,
        e.created_at ASC, e.id ASC
    LIMIT (SELECT n FROM excess)
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = :evicted_by
WHERE e.id = ANY(ARRAY(SELECT id FROM victims))  -- primary-key lookups, no table scan
RETURNING e.id
