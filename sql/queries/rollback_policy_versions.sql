-- Crash recovery: policy versions after after_step that nothing refers to any more.
DELETE FROM policy_versions pv
WHERE pv.run_id = :run_id AND pv.step > :after_step
  AND NOT EXISTS (SELECT 1 FROM rollout_groups g WHERE g.policy_version_id = pv.id)
  AND NOT EXISTS (SELECT 1 FROM experience_versions v WHERE v.policy_version_id = pv.id)
  AND NOT EXISTS (
    SELECT 1 FROM attempts a WHERE a.first_policy_version_id = pv.id OR a.last_policy_version_id = pv.id
  )
