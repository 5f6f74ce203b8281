-- Whether (run, step) is committed.
SELECT 1 FROM run_steps WHERE run_id = :run_id AND step = :step
