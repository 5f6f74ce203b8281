-- The evictions of one training step's insert (add_experiences): they name the run and step whose transaction made
-- them, so a resume that rolls the step back can undo them (rollback_evictions.sql).
UPDATE experiences SET evicted_run_id = :run_id, evicted_step = :step WHERE id = ANY(CAST(:ids AS bigint[]))
