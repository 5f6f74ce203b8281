-- The policy versions (their hashes) that the newest :count committed steps of run :run_id name, newest first: the
-- staged weights a rollout worker may still be loading.
SELECT v.adapter_sha256 FROM run_steps s JOIN policy_versions v ON v.id = s.policy_version_id
WHERE s.run_id = :run_id
ORDER BY s.step DESC
LIMIT :count
