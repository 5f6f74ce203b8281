-- Per-problem cap: keep the best :cap active experiences of each given problem, evict the rest.
-- Keep order by :policy -- oldest: newest first; lowest_reward: highest reward first (NULL reward counts
-- lowest); lowest_relevance: highest relevance first, where an experience's relevance is the mean score of
-- relevance_scores rows naming one of its versions, else the mean score of rows naming its problem as the
-- candidate, else 0. Ties always fall back to recency (created_at, id).
WITH active AS (
    SELECT e.id, e.problem_id, e.created_at,
           CASE :policy
               WHEN 'lowest_reward' THEN e.reward
               WHEN 'lowest_relevance' THEN COALESCE(
                   (SELECT avg(rs.score) FROM relevance_scores rs
                    JOIN experience_versions v ON v.id = rs.candidate_version_id
                    WHERE v.experience_id = e.id),
                   (SELECT avg(rs.score) FROM relevance_scores rs WHERE rs.candidate_problem_id = e.problem_id),
                   0)
           END AS merit
    FROM experiences e
    WHERE e.problem_id = ANY(CAST(:problem_ids AS bigint[])) AND e.evicted_at IS NULL
),
ranked AS (
    SELECT id, row_number() OVER (
        PARTITION BY problem_id ORDER BY merit DESC NULLS LAST, created_at DESC, id DESC
    ) AS keep_rank
    FROM active
)
UPDATE experiences e
SET evicted_at = now(), evicted_by = :evicted_by
WHERE e.id = ANY(ARRAY(SELECT id FROM ranked WHERE keep_rank > :cap))  -- primary-key lookups, no table scan
RETURNING e.id
