-- The weights of a response's first and last segments (partial rollout: an aborted response resumed under newer
-- weights).
UPDATE attempts SET first_policy_version_id = :first, last_policy_version_id = :last WHERE id = :id
