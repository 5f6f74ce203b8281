-- Whether step :step of run :run_id is committed with the policy version :adapter_sha256: a worker hands back
-- groups only of a version the store still holds (a resume rolls back the committed steps after its checkpoint).
SELECT 1 FROM run_steps s JOIN policy_versions v ON v.id = s.policy_version_id
WHERE s.run_id = :run_id AND s.step = :step AND v.adapter_sha256 = :adapter_sha256
