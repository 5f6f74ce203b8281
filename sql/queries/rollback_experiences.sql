-- Crash recovery: experiences of steps after the last committed one (versions cascade).
DELETE FROM experiences WHERE run_id = :run_id AND step > :after_step
