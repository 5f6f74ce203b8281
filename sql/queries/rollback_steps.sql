-- Crash recovery: committed-step rows after after_step.
DELETE FROM run_steps WHERE run_id = :run_id AND step > :after_step
