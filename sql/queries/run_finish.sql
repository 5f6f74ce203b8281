-- Set a run's status; finished_at is now() unless it goes back to running.
UPDATE runs
SET status = :status, finished_at = CASE WHEN :status = 'running' THEN NULL ELSE now() END
WHERE id = :run_id
