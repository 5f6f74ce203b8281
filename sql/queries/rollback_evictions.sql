-- Crash recovery: the experiences that steps after :after_step of the run evicted are active again (run it after
-- rollback_experiences.sql, which deletes the ones those steps inserted).
UPDATE experiences
SET evicted_at = NULL, evicted_by = NULL, evicted_run_id = NULL, evicted_step = NULL
WHERE evicted_run_id = :run_id AND evicted_step > :after_step
