-- The policy version of (run, step).
SELECT id FROM policy_versions WHERE run_id = :run_id AND step = :step
