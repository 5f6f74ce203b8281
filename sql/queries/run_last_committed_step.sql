-- The run's last committed step (NULL: none).
SELECT max(step) FROM run_steps WHERE run_id = :run_id
