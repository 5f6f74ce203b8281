-- Inter-sample draw for a batch: per problem, the current versions of ACTIVE experiences of pool :pool_id from
-- OTHER problems whose relevance (scorer :scorer) is >= :gamma -- relevance given problem-to-problem (candidate_problem_id:
-- every active experience of that problem) or per experience version (candidate_version_id: that version,
-- if it is still the current one); the higher score wins when both exist. Ranked by relevance desc, then
-- recency; the top :candidates form the pool, rank i gets weight 1/(i+1), :k drawn without replacement by
-- Efraimidis-Spirakis keys -ln(u)/w, u from the top 52 bits of sha256('<rank>/<problem id>/<seed>') as in
-- sample_intra.sql (a cryptographic digest, issue 8; the rank, not the lesson's id, so runs whose pools match draw
-- alike whatever else the store holds). Under relevance ranking a rewrite keeps the lesson's rank, so it keeps its
-- draw. The text of the current version is read for the k drawn items only.
-- The same problem is excluded twice over: here (<>) and by the CHECK constraint not_self.
-- :kinds (text[], NULL: every kind) keeps experiences of those kinds only (feedback.inter.kinds: summary, meta).
-- A lesson `lanpo serve` learned in a scope (a user's, an agent's: migration 0022) is never drawn in training.
-- :shows_response (feedback.inter.shows = "response", lanpo's raw-response ablation) returns the response of the
-- rollout the current version was written from (a merge's own source, not version 1's) instead of the summary: the
-- same draw, unsummarised text (the summary when the source attempt is gone).
-- :rank = 'value' (feedback.inter.rank, value-aware draws, docs/concepts.md "Lessons on probation"): every
-- relevant candidate is valued, lanpo_lesson_value(graded, net_credit, net_credit_var, :prior_sd, :z, prior mean) of its current
-- version (migration 0020: an upper confidence bound on its lift), those below :value_bound are dropped, and the
-- rest are ranked by value, then relevance, then recency; relevance only gates (>= :gamma). No candidate left:
-- nothing is drawn and the prompt goes zero-shot. :rank = 'relevance' is the paper's ranking, as above.
-- :prior = 'pool' (feedback.inter.prior) centres the value's prior on the pool's graded lessons' mean lift,
-- lanpo_pool_prior_mean (migration 0025); 'zero' on 0, as before.
WITH req AS (
    SELECT DISTINCT unnest(CAST(:problem_ids AS bigint[])) AS problem_id
),
relevant AS (
    -- problem-level relevance rows, with how many active experiences the strictly better-scored candidate
    -- problems already hold: a candidate can contribute at most candidates - better to the pool.
    SELECT rs.problem_id, rs.candidate_problem_id, rs.score,
           coalesce(sum(cnt.n) OVER (
               PARTITION BY rs.problem_id ORDER BY rs.score DESC
               RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW EXCLUDE GROUP
           ), 0) AS better
    FROM req
    JOIN relevance_scores rs
      ON rs.problem_id = req.problem_id AND rs.scorer = :scorer AND rs.score >= :gamma
     AND rs.candidate_problem_id IS NOT NULL AND rs.candidate_problem_id <> req.problem_id
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM experiences x
        WHERE x.pool_id = :pool_id AND x.problem_id = rs.candidate_problem_id AND x.evicted_at IS NULL
          AND x.scope IS NULL
          AND (CAST(:kinds AS text[]) IS NULL OR x.kind = ANY(CAST(:kinds AS text[])))
    ) cnt
),
by_problem AS (
    SELECT r.problem_id, e.id AS experience_id, e.problem_id AS source_problem_id, r.score, e.created_at
    FROM relevant r
    CROSS JOIN LATERAL (
        SELECT x.id, x.problem_id, x.created_at
        FROM experiences x
        WHERE x.pool_id = :pool_id AND x.problem_id = r.candidate_problem_id AND x.evicted_at IS NULL
          AND x.scope IS NULL
          AND (CAST(:kinds AS text[]) IS NULL OR x.kind = ANY(CAST(:kinds AS text[])))
        ORDER BY x.created_at DESC, x.id DESC
        LIMIT CASE WHEN :rank = 'value' THEN NULL ELSE greatest(:candidates - r.better, 0) END
    ) e
    WHERE :rank = 'value' OR r.better < :candidates
),
by_version AS (
    SELECT rs.problem_id, e.id AS experience_id, e.problem_id AS source_problem_id, rs.score, e.created_at
    FROM req
    JOIN relevance_scores rs
      ON rs.problem_id = req.problem_id AND rs.scorer = :scorer AND rs.score >= :gamma
     AND rs.candidate_version_id IS NOT NULL
    JOIN experience_versions v ON v.id = rs.candidate_version_id
    JOIN experiences e ON e.id = v.experience_id AND e.evicted_at IS NULL AND e.scope IS NULL
                      AND e.problem_id <> req.problem_id
                      AND e.pool_id = :pool_id
                      AND (CAST(:kinds AS text[]) IS NULL OR e.kind = ANY(CAST(:kinds AS text[])))
    WHERE NOT EXISTS (
        SELECT 1 FROM experience_versions newer WHERE newer.experience_id = v.experience_id AND newer.version > v.version
    )
),
candidates AS (
    SELECT problem_id, experience_id, max(source_problem_id) AS source_problem_id, max(score) AS score,
           max(created_at) AS created_at
    FROM (SELECT * FROM by_problem UNION ALL SELECT * FROM by_version) u
    GROUP BY problem_id, experience_id
),
prior AS MATERIALIZED (  -- :prior = 'pool': the pool's graded lessons' mean lift (migration 0025); else 0
    SELECT CASE WHEN :rank = 'value' AND :prior = 'pool' THEN lanpo_pool_prior_mean(:pool_id, :prior_sd) ELSE 0 END
               AS mean
),
valued AS (
    SELECT c.*, CASE WHEN :rank = 'value'
                THEN lanpo_lesson_value(u.graded, u.net_credit, u.net_credit_var, :prior_sd, :z, prior.mean) END
                    AS value
    FROM candidates c
    CROSS JOIN prior
    LEFT JOIN LATERAL (  -- the current version, read under rank = value only (a one-time filter otherwise)
        SELECT ev.id FROM experience_versions ev
        WHERE ev.experience_id = c.experience_id AND :rank = 'value' ORDER BY ev.version DESC LIMIT 1
    ) cur ON true
    LEFT JOIN lesson_usefulness u ON u.version_id = cur.id
),
pool AS (
    SELECT * FROM (
        SELECT c.*, row_number() OVER (
            PARTITION BY problem_id ORDER BY value DESC NULLS LAST, score DESC, created_at DESC, experience_id DESC
        ) - 1 AS rank
        FROM valued c
        WHERE :rank <> 'value' OR c.value >= :value_bound
    ) ranked
    WHERE rank < :candidates
),
keyed AS (
    -- lanpo_draw_key (migration 0009): -ln(u) * (rank + 1), u from sha256('<rank>/<problem>/<seed>').
    SELECT problem_id, experience_id, source_problem_id, score, rank,
           lanpo_draw_key(CAST(:seed AS bigint), rank, problem_id, rank) AS key
    FROM pool
),
drawn AS (
    SELECT problem_id, experience_id, source_problem_id, score, rank,
           row_number() OVER (PARTITION BY problem_id ORDER BY key, experience_id) - 1 AS position
    FROM keyed
)
SELECT d.problem_id, v.id AS candidate_id, d.rank, d.position,
       CASE WHEN CAST(:shows_response AS boolean) THEN coalesce(a.response, v.summary) ELSE v.summary END AS text,
       d.score, d.source_problem_id
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
