-- Crash recovery: attempts of steps after the last committed one (contexts cascade).
DELETE FROM attempts WHERE run_id = :run_id AND step > :after_step
