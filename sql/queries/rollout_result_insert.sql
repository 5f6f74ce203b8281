-- A finished work row's groups, once: the key is the work row's, so a second result for it is refused.
INSERT INTO rollout_results (work_id, policy_step, served_sha256, worker, groups, seconds)
VALUES (:work_id, :policy_step, :served_sha256, :worker, CAST(:groups AS jsonb), CAST(:seconds AS jsonb))
