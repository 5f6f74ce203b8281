-- The run's groups a trainer names (rollout_groups.trainer_uid: verl's uid), with the versions their contexts used:
-- what a re-issued group replaces, and what a trainer's consumption marks.
SELECT g.id, g.trainer_uid, g.step, g.consumed_step,
       array_remove(array_agg(DISTINCT gc.experience_version_id), NULL) AS used
FROM rollout_groups g
LEFT JOIN group_contexts gc ON gc.group_id = g.id
WHERE g.run_id = :run_id AND g.trainer_uid = ANY(:uids)
GROUP BY g.id
