-- How many experiences (lessons) the run's step `step` has added so far: what its lesson cap counts.
SELECT count(*) FROM experiences WHERE run_id = :run_id AND step = :step
