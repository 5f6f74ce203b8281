-- Active pool size of every problem in pool :pool_id (NULL: every pool; optionally one :dataset), for
-- min / median / max in `lanpo pool stats`.
SELECT count(e.id) AS size
FROM problems p
LEFT JOIN experiences e
       ON e.problem_id = p.id AND e.evicted_at IS NULL AND (CAST(:pool_id AS bigint) IS NULL OR e.pool_id = :pool_id)
WHERE CAST(:dataset AS text) IS NULL OR p.dataset = :dataset
GROUP BY p.id
