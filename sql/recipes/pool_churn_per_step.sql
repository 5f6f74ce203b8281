-- Pool churn per step: per pool, run and step, the lessons added, merged into existing ones, and gone (evicted,
-- expired, retired by hand), with the net change of the active pool so far in that run. Retirements outside a step
-- come last (run_id and step NULL).
SELECT pool, run_id, step, added, merged, left_pool, evicted, expired, retired,
       CAST(sum(added - left_pool) OVER (PARTITION BY pool_id, run_id ORDER BY step) AS bigint) AS net_so_far,
       evicted_by
FROM pool_churn
ORDER BY pool, run_id NULLS LAST, step NULLS LAST;
