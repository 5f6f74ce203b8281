-- Per-problem cap under policy `oldest` (the default): in the pool, every active experience of the given
-- problems beyond the cap newest (created_at, id) is evicted. The same victims as evict_per_problem.sql under
-- policy oldest (a test compares them), read straight off the active-pool index in its order: no ranking of the
-- problems' whole pools, no sort.
UPDATE experiences e
SET evicted_at = now(), evicted_by = :evicted_by
WHERE e.id = ANY(ARRAY(
    SELECT beyond.id
    FROM unnest(CAST(:problem_ids AS bigint[])) AS p(problem_id)
    CROSS JOIN LATERAL (
        SELECT x.id
        FROM experiences x
        WHERE x.pool_id = :pool_id AND x.problem_id = p.problem_id AND x.evicted_at IS NULL
        ORDER BY x.created_at DESC, x.id DESC
        OFFSET :cap
    ) beyond
))  -- primary-key lookups, no table scan
RETURNING e.id
