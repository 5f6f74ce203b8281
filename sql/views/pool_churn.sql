-- Per pool, run and step: what entered and what left the pool. added: new lessons (experiences) written at the
-- step; merged: versions a merge appended there (reason 'merge:%'; the lesson stays one lesson); left_pool: lessons
-- that left it in that step's transaction (experiences.evicted_run_id / evicted_step) = evicted (by a capacity or
-- usefulness policy, or rejected) + expired ('expired:policy_age') + retired (by hand, 'manual:retired');
-- evicted_by: a JSON object of every reason that took lessons out, with its count. Lessons that left outside a
-- training step (a hand retirement, an insert that names no step) count in the row whose run_id and step are NULL.
CREATE OR REPLACE VIEW pool_churn AS
WITH events AS (
    SELECT e.pool_id, e.run_id, e.step, 'added' AS event, CAST(NULL AS text) AS evicted_by,
           CAST(count(*) AS integer) AS n
    FROM experiences e
    GROUP BY e.pool_id, e.run_id, e.step
    UNION ALL
    SELECT e.pool_id, v.run_id, v.step, 'merged', NULL, CAST(count(*) AS integer)
    FROM experience_versions v
    JOIN experiences e ON e.id = v.experience_id
    WHERE v.reason LIKE 'merge:%'
    GROUP BY e.pool_id, v.run_id, v.step
    UNION ALL
    SELECT e.pool_id, e.evicted_run_id, e.evicted_step, 'left', e.evicted_by, CAST(count(*) AS integer)
    FROM experiences e
    WHERE e.evicted_at IS NOT NULL
    GROUP BY e.pool_id, e.evicted_run_id, e.evicted_step, e.evicted_by
)
SELECT ev.pool_id, pl.name AS pool, ev.run_id, ev.step,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'added'), 0) AS added,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'merged'), 0) AS merged,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'left'), 0) AS left_pool,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'left' AND ev.evicted_by NOT LIKE 'expired:%'
                                  AND ev.evicted_by NOT LIKE 'manual:%'), 0) AS evicted,
       coalesce(sum(ev.n) FILTER (WHERE ev.evicted_by LIKE 'expired:%'), 0) AS expired,
       coalesce(sum(ev.n) FILTER (WHERE ev.evicted_by LIKE 'manual:%'), 0) AS retired,
       coalesce(jsonb_object_agg(ev.evicted_by, ev.n) FILTER (WHERE ev.event = 'left'), '{}') AS evicted_by
FROM events ev
JOIN pools pl ON pl.id = ev.pool_id
GROUP BY ev.pool_id, pl.name, ev.run_id, ev.step;
