-- Counts for `lanpo pool stats`: problems, active / evicted experiences of pool :pool_id (NULL: every pool),
-- attempts (optionally one :dataset).
SELECT
    (SELECT count(*) FROM problems p WHERE CAST(:dataset AS text) IS NULL OR p.dataset = :dataset) AS problems,
    (SELECT count(*) FROM experiences e JOIN problems p ON p.id = e.problem_id
     WHERE e.evicted_at IS NULL AND (CAST(:pool_id AS bigint) IS NULL OR e.pool_id = :pool_id)
       AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)) AS active,
    (SELECT count(*) FROM experiences e JOIN problems p ON p.id = e.problem_id
     WHERE e.evicted_at IS NOT NULL AND (CAST(:pool_id AS bigint) IS NULL OR e.pool_id = :pool_id)
       AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)) AS evicted,
    (SELECT count(*) FROM attempts a JOIN rollout_groups g ON g.id = a.group_id JOIN problems p ON p.id = g.problem_id
     WHERE CAST(:dataset AS text) IS NULL OR p.dataset = :dataset) AS attempts
