-- Crash recovery: rollout work of steps after :after_step, when committed steps are rolled back with it (their
-- prompts were drawn from a pool that held the rolled-back steps' rows; the queue draws them again). Work of the
-- one uncommitted step after the last committed one is kept, as before: a resume takes it again.
DELETE FROM rollout_work w
WHERE w.run_id = :run_id AND w.step > :after_step
  AND EXISTS (SELECT 1 FROM run_steps s WHERE s.run_id = :run_id AND s.step > :after_step)
