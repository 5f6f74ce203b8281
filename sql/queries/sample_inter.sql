-- Inter-sample draw for a batch: per problem, the current versions of ACTIVE experiences of OTHER problems
-- whose relevance (scorer :scorer) is >= :gamma -- relevance given problem-to-problem (candidate_problem_id:
-- every active experience of that problem) or per experience version (candidate_version_id: that version,
-- if it is still the current one); the higher score wins when both exist. Ranked by relevance desc, then
-- recency; the top :pool_size form the pool, rank i gets weight 1/(i+1), :k drawn without replacement by
-- Efraimidis-Spirakis keys -ln(u)/w with u a deterministic hash of (version, problem, seed).
-- The same problem is excluded twice over: here (<>) and by the CHECK constraint not_self.
WITH req AS (
    SELECT DISTINCT unnest(CAST(:problem_ids AS bigint[])) AS problem_id
),
by_problem AS (
    SELECT rs.problem_id, cv.version_id, cv.source_problem_id, rs.score, cv.created_at
    FROM req
    JOIN relevance_scores rs
      ON rs.problem_id = req.problem_id AND rs.scorer = :scorer AND rs.score >= :gamma
     AND rs.candidate_problem_id IS NOT NULL AND rs.candidate_problem_id <> req.problem_id
    CROSS JOIN LATERAL (
        SELECT v.id AS version_id, e.problem_id AS source_problem_id, e.created_at
        FROM experiences e
        CROSS JOIN LATERAL (
            SELECT id FROM experience_versions WHERE experience_id = e.id ORDER BY version DESC LIMIT 1
        ) v
        WHERE e.problem_id = rs.candidate_problem_id AND e.evicted_at IS NULL
        ORDER BY e.created_at DESC, e.id DESC
        LIMIT :pool_size
    ) cv
),
by_version AS (
    SELECT rs.problem_id, v.id AS version_id, e.problem_id AS source_problem_id, rs.score, e.created_at
    FROM req
    JOIN relevance_scores rs
      ON rs.problem_id = req.problem_id AND rs.scorer = :scorer AND rs.score >= :gamma
     AND rs.candidate_version_id IS NOT NULL
    JOIN experience_versions v ON v.id = rs.candidate_version_id
    JOIN experiences e ON e.id = v.experience_id AND e.evicted_at IS NULL AND e.problem_id <> req.problem_id
    WHERE v.version = (SELECT max(version) FROM experience_versions WHERE experience_id = e.id)
),
candidates AS (
    SELECT DISTINCT ON (problem_id, version_id) problem_id, version_id, source_problem_id, score, created_at
    FROM (SELECT * FROM by_problem UNION ALL SELECT * FROM by_version) u
    ORDER BY problem_id, version_id, score DESC
),
pool AS (
    SELECT * FROM (
        SELECT c.*, row_number() OVER (
            PARTITION BY problem_id ORDER BY score DESC, created_at DESC, version_id DESC
        ) - 1 AS rank
        FROM candidates c
    ) ranked
    WHERE rank < :pool_size
),
drawn AS (
    SELECT problem_id, version_id, source_problem_id, score, rank,
           row_number() OVER (
               PARTITION BY problem_id
               ORDER BY -ln((CAST((hashint8extended(version_id, hashint8extended(problem_id, CAST(:seed AS bigint))) >> 11)
                 + 4503599627370496 AS float8) + 0.5) / 9007199254740992.0) * (rank + 1), version_id
           ) - 1 AS position
    FROM pool
)
SELECT d.problem_id, d.version_id AS candidate_id, d.rank, d.position, v.summary AS text, d.score,
       d.source_problem_id
FROM drawn d
JOIN experience_versions v ON v.id = d.version_id
WHERE d.position < :k
ORDER BY d.problem_id, d.position
