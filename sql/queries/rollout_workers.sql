-- The rollout workers of every run (or of the runs in :names, when not NULL): each worker that holds a claim or
-- finished a step, the step it holds and the seconds left on that lease (negative: the lease ran out and the next
-- claim redoes the step), the steps it finished, and the seconds since its last one, by the database's clock.
WITH held AS (
    SELECT run_id, claimed_by AS worker, max(step) AS holding,
           extract(epoch FROM max(lease_until) - clock_timestamp())::float8 AS lease_left_s
    FROM rollout_work WHERE status = 'claimed'
    GROUP BY run_id, claimed_by
), finished AS (
    SELECT w.run_id, r.worker, count(*) AS finished,
           extract(epoch FROM clock_timestamp() - max(w.finished_at))::float8 AS last_finished_age_s
    FROM rollout_results r JOIN rollout_work w ON w.id = r.work_id
    GROUP BY w.run_id, r.worker
)
SELECT ru.name AS run, coalesce(h.worker, f.worker) AS worker, h.holding, h.lease_left_s,
       coalesce(f.finished, 0) AS finished, f.last_finished_age_s
FROM held h FULL JOIN finished f ON f.run_id = h.run_id AND f.worker = h.worker
JOIN runs ru ON ru.id = coalesce(h.run_id, f.run_id)
WHERE CAST(:names AS text[]) IS NULL OR ru.name = ANY(CAST(:names AS text[]))
ORDER BY ru.id, 2
