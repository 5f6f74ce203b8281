-- Bulk load of MEL's diagnosed pairs with ids reserved by reserve_ids.sql (psycopg cursor.copy, text rows).
COPY meta_pairs (id, run_id, step, problem_id, positive_attempt_id, negative_attempt_id, step_split, bifurcation_step,
                 shared_prefix_steps, located_by, diagnosis, prompt_version, group_success_rate, experience_id,
                 replay_group_id, replay_success_rate, validation_rule, verdict)
FROM STDIN
