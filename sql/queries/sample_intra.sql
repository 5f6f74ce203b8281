-- Intra-sample draw for a batch: per problem, its most recent attempts (optionally of one run; validation
-- attempts, MEL's replays, replayed copies of stored attempts and the leaked-intra arm's never) form the pool
-- (top :candidates, newest group first, then newest attempt), rank i gets weight 1/(i+1), and :k are drawn without
-- replacement by Efraimidis-Spirakis keys -ln(u)/w (smallest k win). u comes from the top 52 bits of
-- sha256('<rank>/<problem id>/<seed>'), plus one half, over 2^52: exact in float8 and strictly inside (0, 1).
-- A cryptographic digest, because a weak hash of nearby numbers gives correlated u within a pool and biased draws
-- (issue 8). The same seed gives the same draws, whatever the batch. u names the candidate's rank, not its attempt
-- id: ranks are a function of the pool's order, so two runs whose histories match draw alike whatever else the
-- store holds (attempt ids are the store's, and differ between runs of one home).
-- Returns one row per draw: problem, attempt id, rank, draw position (0-based, in key order), response.
WITH req AS (
    SELECT DISTINCT unnest(CAST(:problem_ids AS bigint[])) AS problem_id
),
pool AS (
    SELECT req.problem_id, c.id AS candidate_id, c.rank
    FROM req
    CROSS JOIN LATERAL (
        SELECT a.id, row_number() OVER (ORDER BY g.created_at DESC, g.id DESC, a.id DESC) - 1 AS rank
        FROM rollout_groups g
        JOIN attempts a ON a.group_id = g.id
        WHERE g.problem_id = req.problem_id AND g.mode NOT IN ('val', 'replay', 'replayed', 'leaked_intra')
          AND (CAST(:run_id AS bigint) IS NULL OR g.run_id = CAST(:run_id AS bigint))
        ORDER BY g.created_at DESC, g.id DESC, a.id DESC
        LIMIT :candidates
    ) c
),
keyed AS (
    -- lanpo_draw_key (migration 0009): -ln(u) * (rank + 1), u from sha256('<rank>/<problem>/<seed>').
    SELECT problem_id, candidate_id, rank,
           lanpo_draw_key(CAST(:seed AS bigint), rank, problem_id, rank) AS key
    FROM pool
),
drawn AS (
    SELECT problem_id, candidate_id, rank,
           row_number() OVER (PARTITION BY problem_id ORDER BY key, candidate_id) - 1 AS position
    FROM keyed
)
SELECT d.problem_id, d.candidate_id, d.rank, d.position, a.response AS text
FROM drawn d
JOIN attempts a ON a.id = d.candidate_id
WHERE d.position < :k
ORDER BY d.problem_id, d.position
