-- MEL's validation yield of one run, step by step (pairs -> candidates -> validated).
SELECT * FROM meta_experience_yield WHERE run_id = :run_id ORDER BY step
