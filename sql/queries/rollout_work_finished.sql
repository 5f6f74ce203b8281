-- The finished work of step :step of run :run_id that the trainer has not used nor dropped, newest attempt first,
-- with its groups.
SELECT w.id, w.attempt, w.claims, w.prompts, r.policy_step, r.served_sha256, r.worker, r.groups, r.seconds
FROM rollout_work w JOIN rollout_results r ON r.work_id = w.id
WHERE w.run_id = :run_id AND w.step = :step AND w.status = 'done'
ORDER BY w.attempt DESC
LIMIT 1
