-- Crash recovery: metrics of steps after the last committed one.
DELETE FROM run_metrics WHERE run_id = :run_id AND step > :after_step
