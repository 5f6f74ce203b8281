-- Global cap: evict the worst active experiences of pool :pool_id until at most :cap remain.
-- Worst-first order by :policy as in evict_per_problem.sql (oldest, lowest reward, lowest relevance, lowest
-- utility: the lowest expected lift, a tried lesson's shrunk toward 0 and an untried one's 0; ties by age). Call it
-- holding the pool's lock of lock_global_cap.sql.
WITH excess AS (
    SELECT greatest(count(*) - :cap, 0) AS n FROM experiences WHERE pool_id = :pool_id AND evicted_at IS NULL
),
version_relevance AS (
    SELECT v.experience_id, avg(rs.score) AS score
    FROM relevance_scores rs
    JOIN experience_versions v ON v.id = rs.candidate_version_id
    WHERE :policy = 'lowest_relevance'
    GROUP BY v.experience_id
),
utility AS (
    SELECT e.id AS experience_id,
           CASE WHEN lu.helped + lu.hurt + lu.even >= :min_uses
                THEN lanpo_lesson_value(lu.graded, lu.net_credit, lu.net_credit_var, :prior_sd, 0) ELSE 0 END AS value
    FROM experiences e
    CROSS JOIN LATERAL (
        SELECT v.id FROM experience_versions v WHERE v.experience_id = e.id ORDER BY v.version DESC LIMIT 1
    ) cv
    JOIN lesson_usefulness lu ON lu.version_id = cv.id
    WHERE :policy = 'lowest_utility' AND e.pool_id = :pool_id AND e.evicted_at IS NULL
),
problem_relevance AS (
    SELECT rs.candidate_problem_id AS problem_id, avg(rs.score) AS score
    FROM relevance_scores rs
    WHERE :policy = 'lowest_relevance' AND rs.candidate_problem_id IS NOT NULL
    GROUP BY rs.candidate_problem_id
),
victims AS (
    SELECT e.id
    FROM experiences e
    LEFT JOIN version_relevance vr ON vr.experience_id = e.id
    LEFT JOIN problem_relevance pr ON pr.problem_id = e.problem_id
    LEFT JOIN utility u ON u.experience_id = e.id
    WHERE e.pool_id = :pool_id AND e.evicted_at IS NULL
    ORDER BY CASE :policy
                 WHEN 'lowest_reward' THEN e.reward
                 WHEN 'lowest_relevance' THEN coalesce(vr.score, pr.score, 0)
                 WHEN 'lowest_utility' THEN coalesce(u.value, 0)
             END ASC NULLS FIRST,
             e.created_at ASC, e.id ASC
    LIMIT (SELECT n FROM excess)
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = :evicted_by
WHERE e.id = ANY(ARRAY(SELECT id FROM victims))  -- primary-key lookups, no table scan
RETURNING e.id
