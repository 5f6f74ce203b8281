-- Inter-sample draw with NO relevance filter (feedback.inter.gamma = 0; lanpo's reading of Table 2's "w/o filtering",
-- which only drops the threshold and would still rank by relevance): per problem, every ACTIVE experience of pool
-- :pool_id from another problem is a candidate, whether or not any relevance score names it; relevance is not
-- consulted at all. Candidates are ranked by recency (newest first), the top
-- :candidates form the pool, rank i gets weight 1/(i+1), and :k are drawn without replacement by the same
-- Efraimidis-Spirakis keys as sample_inter.sql (keyed by rank, problem id and seed).
-- :kinds and :shows_response as in sample_inter.sql (experience kinds kept; the source rollout's response instead of
-- the summary). score is NULL. :rank = 'value' as in sample_inter.sql: every other problem's lesson is valued
-- (lanpo_lesson_value of its current version, under :prior as in sample_inter.sql), those below :value_bound dropped, the rest ranked by value, then
-- recency. A lesson `lanpo serve` learned in a scope (migration 0022) is never drawn in training.
WITH req AS (
    SELECT DISTINCT unnest(CAST(:problem_ids AS bigint[])) AS problem_id
),
prior AS MATERIALIZED (  -- :prior = 'pool': the pool's graded lessons' mean lift (migration 0025); else 0
    SELECT CASE WHEN :rank = 'value' AND :prior = 'pool' THEN lanpo_pool_prior_mean(:pool_id, :prior_sd) ELSE 0 END
               AS mean
),
pool AS (
    SELECT req.problem_id, c.experience_id, c.source_problem_id, c.rank
    FROM req
    CROSS JOIN LATERAL (
        SELECT y.experience_id, y.source_problem_id,
               row_number() OVER (ORDER BY y.value DESC NULLS LAST, y.created_at DESC, y.experience_id DESC) - 1
                   AS rank
        FROM (
            SELECT x.id AS experience_id, x.problem_id AS source_problem_id, x.created_at,
                   CASE WHEN :rank = 'value'
                        THEN lanpo_lesson_value(u.graded, u.net_credit, u.net_credit_var, :prior_sd, :z,
                                                prior.mean)
                        END AS value
            FROM experiences x
            CROSS JOIN prior
            LEFT JOIN LATERAL (  -- the current version, read under rank = value only
                SELECT ev.id FROM experience_versions ev
                WHERE ev.experience_id = x.id AND :rank = 'value' ORDER BY ev.version DESC LIMIT 1
            ) cur ON true
            LEFT JOIN lesson_usefulness u ON u.version_id = cur.id
            WHERE x.pool_id = :pool_id AND x.evicted_at IS NULL AND x.scope IS NULL AND x.problem_id <> req.problem_id
              AND (CAST(:kinds AS text[]) IS NULL OR x.kind = ANY(CAST(:kinds AS text[])))
        ) y
        WHERE :rank <> 'value' OR y.value >= :value_bound
        ORDER BY y.value DESC NULLS LAST, y.created_at DESC, y.experience_id DESC
        LIMIT :candidates
    ) c
),
keyed AS (
    -- lanpo_draw_key (migration 0009): -ln(u) * (rank + 1), u from sha256('<rank>/<problem>/<seed>').
    SELECT problem_id, experience_id, source_problem_id, rank,
           lanpo_draw_key(CAST(:seed AS bigint), rank, problem_id, rank) AS key
    FROM pool
),
drawn AS (
    SELECT problem_id, experience_id, source_problem_id, rank,
           row_number() OVER (PARTITION BY problem_id ORDER BY key, experience_id) - 1 AS position
    FROM keyed
)
SELECT d.problem_id, v.id AS candidate_id, d.rank, d.position,
       CASE WHEN CAST(:shows_response AS boolean) THEN coalesce(a.response, v.summary) ELSE v.summary END AS text,
       CAST(NULL AS float8) AS score, d.source_problem_id
FROM drawn d
CROSS JOIN LATERAL (
    SELECT ev.id, ev.summary, ev.source_attempt_id FROM experience_versions ev
    WHERE ev.experience_id = d.experience_id
    ORDER BY ev.version DESC
    LIMIT 1
) v
LEFT JOIN attempts a ON a.id = v.source_attempt_id
WHERE d.position < :k
ORDER BY d.problem_id, d.position
