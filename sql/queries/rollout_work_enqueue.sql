-- Queue step :step of run :run_id as its next attempt, unless a live attempt of it (queued, claimed, done or used)
-- is there already; returns the new row's id (no row back: the step was queued before).
INSERT INTO rollout_work (run_id, step, attempt, prompts, min_policy_step)
SELECT :run_id, :step,
       coalesce((SELECT max(attempt) + 1 FROM rollout_work WHERE run_id = :run_id AND step = :step), 0),
       CAST(:prompts AS jsonb), :min_policy_step
WHERE NOT EXISTS (SELECT 1 FROM rollout_work WHERE run_id = :run_id AND step = :step AND status <> 'dropped')
RETURNING id
