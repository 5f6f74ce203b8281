-- The steps before :before whose groups are written and which are not committed yet, oldest first.
SELECT DISTINCT g.step
FROM rollout_groups g
WHERE g.run_id = :run_id AND g.step < :before
  AND NOT EXISTS (SELECT 1 FROM run_steps s WHERE s.run_id = g.run_id AND s.step = g.step)
ORDER BY g.step
