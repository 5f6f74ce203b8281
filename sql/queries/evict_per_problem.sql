-- Per-problem cap: keep the best :cap active experiences of each given problem in pool :pool_id, evict the rest.
-- Keep order by :policy -- oldest: newest first; lowest_reward: highest reward first (NULL reward counts
-- lowest); lowest_relevance: highest relevance first, where an experience's relevance is the mean score of
-- relevance_scores rows naming one of its versions, else the mean score of rows naming its problem as the
-- candidate, else 0; lowest_utility: the highest expected lift first -- a lesson whose current version has at
-- least :min_uses uses with a known outcome (lesson_usefulness helped + hurt + even) at its lift shrunk toward 0
-- under a N(0, :prior_sd^2) prior (lanpo_lesson_value at z = 0, migration 0020), an untried one at 0, the prior's
-- mean -- so a lesson known to help outlives the untried, and the untried outlive one known to hurt (issue 64: the
-- tried leaving before every untried one evicted the helpful lessons). Ties always fall back to recency (created_at, id). The
-- relevance means are computed once per statement (one pass over relevance_scores), and only under
-- lowest_relevance; the usefulness rows are read only under lowest_utility.
WITH active AS MATERIALIZED (
    SELECT e.id, e.problem_id, e.created_at, e.reward
    FROM experiences e
    WHERE e.pool_id = :pool_id AND e.problem_id = ANY(CAST(:problem_ids AS bigint[])) AND e.evicted_at IS NULL
),
version_relevance AS (
    SELECT v.experience_id, avg(rs.score) AS score
    FROM active a
    JOIN experience_versions v ON v.experience_id = a.id
    JOIN relevance_scores rs ON rs.candidate_version_id = v.id
    WHERE :policy = 'lowest_relevance'
    GROUP BY v.experience_id
),
utility AS (
    SELECT a.id AS experience_id,
           CASE WHEN lu.helped + lu.hurt + lu.even >= :min_uses
                THEN lanpo_lesson_value(lu.graded, lu.net_credit, lu.net_credit_var, :prior_sd, 0) ELSE 0 END AS value
    FROM active a
    CROSS JOIN LATERAL (
        SELECT v.id FROM experience_versions v WHERE v.experience_id = a.id ORDER BY v.version DESC LIMIT 1
    ) cv
    JOIN lesson_usefulness lu ON lu.version_id = cv.id
    WHERE :policy = 'lowest_utility'
),
problem_relevance AS (
    SELECT rs.candidate_problem_id AS problem_id, avg(rs.score) AS score
    FROM relevance_scores rs
    WHERE :policy = 'lowest_relevance' AND rs.candidate_problem_id = ANY(CAST(:problem_ids AS bigint[]))
    GROUP BY rs.candidate_problem_id
),
ranked AS (
    SELECT a.id, row_number() OVER (
        PARTITION BY a.problem_id
        ORDER BY CASE :policy
                     WHEN 'lowest_reward' THEN a.reward
                     WHEN 'lowest_relevance' THEN coalesce(vr.score, pr.score, 0)
                     WHEN 'lowest_utility' THEN coalesce(u.value, 0)
                 END DESC NULLS LAST,
                 a.created_at DESC, a.id DESC
    ) AS keep_rank
    FROM active a
    LEFT JOIN version_relevance vr ON vr.experience_id = a.id
    LEFT JOIN problem_relevance pr ON pr.problem_id = a.problem_id
    LEFT JOIN utility u ON u.experience_id = a.id
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = :evicted_by
WHERE e.id = ANY(ARRAY(SELECT id FROM ranked WHERE keep_rank > :cap))  -- primary-key lookups, no table scan
RETURNING e.id
