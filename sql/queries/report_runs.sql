-- The runs :run_ids and every run of the experiments :experiment_ids, with what a report groups and labels
-- them by: experiment and arm, seed, the feedback asked for (mode, p_t) and the group size (rollout.n).
SELECT r.id, r.name, r.kind, r.status, r.started_at, r.finished_at, e.name AS experiment, r.arm,
       r.config ->> 'seed' AS seed,
       r.config -> 'feedback' ->> 'mode' AS feedback_mode,
       r.config -> 'feedback' ->> 'p_t' AS p_t,
       r.config -> 'rollout' ->> 'n' AS group_size,
       (SELECT max(s.step) FROM run_steps AS s WHERE s.run_id = r.id) AS last_step
FROM runs AS r
LEFT JOIN experiments AS e ON e.id = r.experiment_id
WHERE r.id = ANY(CAST(:run_ids AS bigint[])) OR r.experiment_id = ANY(CAST(:experiment_ids AS bigint[]))
ORDER BY e.name NULLS FIRST, r.arm NULLS FIRST, r.id
