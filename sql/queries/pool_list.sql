-- Every pool with its capacity settings, active / evicted experiences and the runs that use it.
SELECT pl.id, pl.name, pl.per_problem_cap, pl.per_step_cap, pl.global_cap, pl.eviction, pl.created_at, pl.min_uses,
       pl.merge_threshold, pl.merge_keeps, pl.max_policy_age, pl.baseline_half_life, pl.baseline_prior,
       pl.retire_below,
       (SELECT count(*) FROM experiences e WHERE e.pool_id = pl.id AND e.evicted_at IS NULL) AS active,
       (SELECT count(*) FROM experiences e WHERE e.pool_id = pl.id AND e.evicted_at IS NOT NULL) AS evicted,
       coalesce((SELECT string_agg(r.name, ', ' ORDER BY r.id) FROM runs r WHERE r.pool_id = pl.id), '') AS runs
FROM pools pl
ORDER BY pl.id
