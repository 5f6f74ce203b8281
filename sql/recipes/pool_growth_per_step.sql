-- Pool growth per step: experiences added per run and step, how many of those are still active, and the
-- running total added by the run.
SELECT e.run_id, e.step, count(*) AS added, count(*) FILTER (WHERE e.evicted_at IS NULL) AS still_active,
       sum(count(*)) OVER (PARTITION BY e.run_id ORDER BY e.step) AS added_so_far
FROM experiences e
WHERE e.run_id IS NOT NULL
GROUP BY e.run_id, e.step
ORDER BY e.run_id, e.step;
