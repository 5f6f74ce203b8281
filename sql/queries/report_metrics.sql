-- Every metric of the runs :run_ids, one row per (run, name, step), in plotting order.
SELECT m.run_id, m.name, m.step, m.value
FROM run_metrics AS m
WHERE m.run_id = ANY(CAST(:run_ids AS bigint[]))
ORDER BY m.run_id, m.name, m.step
