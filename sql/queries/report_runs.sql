-- The runs :run_ids and every run of the experiments :experiment_ids, with what a report groups and labels
-- them by: experiment and arm, seed, the feedback asked for (mode, p_t) and the group size (rollout.n). A run of
-- another trainer through the store client (TRL, verl, your own) keeps lanpo's tables under config.lanpo, and its
-- group size under its trainer's own keys.
SELECT r.id, r.name, r.kind, r.status, r.started_at, r.finished_at, e.name AS experiment, r.arm,
       coalesce(r.config ->> 'seed', r.config -> 'lanpo' ->> 'seed') AS seed,
       coalesce(r.config -> 'feedback', r.config -> 'lanpo' -> 'feedback') ->> 'mode' AS feedback_mode,
       coalesce(r.config -> 'feedback', r.config -> 'lanpo' -> 'feedback') ->> 'p_t' AS p_t,
       coalesce(r.config -> 'rollout' ->> 'n', r.config -> 'trl' ->> 'num_generations',
                r.config #>> '{verl,actor_rollout_ref,rollout,n}') AS group_size,
       (SELECT max(s.step) FROM run_steps AS s WHERE s.run_id = r.id) AS last_step
FROM runs AS r
LEFT JOIN experiments AS e ON e.id = r.experiment_id
WHERE r.id = ANY(CAST(:run_ids AS bigint[])) OR r.experiment_id = ANY(CAST(:experiment_ids AS bigint[]))
ORDER BY e.name NULLS FIRST, r.arm NULLS FIRST, r.id
