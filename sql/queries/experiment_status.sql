-- Set an experiment's status; finished_at is now() once it is no longer running.
UPDATE experiments
SET status = :status, finished_at = CASE WHEN :status = 'running' THEN NULL ELSE now() END
WHERE id = :id
