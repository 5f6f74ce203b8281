-- The run's last committed step that names a checkpoint (NULL: none): where a resume continues from.
SELECT max(step) FROM run_steps WHERE run_id = :run_id AND checkpoint IS NOT NULL
