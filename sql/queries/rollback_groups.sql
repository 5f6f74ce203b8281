-- Crash recovery: rollout groups of steps after the last committed one (their attempts and contexts cascade).
DELETE FROM rollout_groups WHERE run_id = :run_id AND step > :after_step
