-- Every pair one run's MEL diagnosed, with its lesson, replays, verdict and NLL steps.
SELECT * FROM meta_experience_history WHERE run_id = :run_id ORDER BY step, pair_id
