-- The lesson versions used by run :run_id's rollout groups of steps after :after_step, in id order: what a resume's
-- rollback (rollback_groups.sql) takes uses from, read before it deletes them.
SELECT DISTINCT gc.experience_version_id
FROM rollout_groups g
JOIN group_contexts gc ON gc.group_id = g.id
WHERE g.run_id = :run_id AND g.step > :after_step AND gc.experience_version_id IS NOT NULL
ORDER BY 1
