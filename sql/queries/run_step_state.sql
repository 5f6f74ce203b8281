-- A committed step's checkpoint folder and the sha256 of the adapter its policy version holds.
SELECT s.checkpoint, pv.adapter_sha256
FROM run_steps s
LEFT JOIN policy_versions pv ON pv.id = s.policy_version_id
WHERE s.run_id = :run_id AND s.step = :step
