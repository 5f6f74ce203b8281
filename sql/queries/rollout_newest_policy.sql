-- The newest committed step of run :run_id: the policy version a worker serves, its checkpoint and hashes.
SELECT s.step, s.checkpoint, v.adapter_sha256, v.served_sha256
FROM run_steps s JOIN policy_versions v ON v.id = s.policy_version_id
WHERE s.run_id = :run_id
ORDER BY s.step DESC
LIMIT 1
