-- Mark a run finished or failed, now.
UPDATE runs SET status = :status, finished_at = now() WHERE id = :run_id
