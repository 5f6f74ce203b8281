-- The newest step the run wrote groups for (committed or not); NULL when it wrote none.
SELECT max(step) FROM rollout_groups WHERE run_id = :run_id
