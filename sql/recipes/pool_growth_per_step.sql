-- Pool growth per step: experiences added per pool, run and step, how many of those are still active, and the
-- running total the run added to its pool.
SELECT pl.name AS pool, e.run_id, e.step, count(*) AS added,
       count(*) FILTER (WHERE e.evicted_at IS NULL) AS still_active,
       sum(count(*)) OVER (PARTITION BY e.pool_id, e.run_id ORDER BY e.step) AS added_so_far
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
WHERE e.run_id IS NOT NULL
GROUP BY pl.name, e.pool_id, e.run_id, e.step
ORDER BY pl.name, e.run_id, e.step;
