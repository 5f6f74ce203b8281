-- A resumed run is running again: status back to running, finish time cleared.
UPDATE runs SET status = 'running', finished_at = NULL WHERE id = :run_id
