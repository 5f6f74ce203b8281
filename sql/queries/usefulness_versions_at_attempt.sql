-- The lesson versions whose outcomes a verdict on attempt :attempt_id can change, in id order: those its own group
-- used (the verdict grades that use), and those used by any group at its group's (run, step, problem) key (the
-- verdict of a zero-shot attempt moves their baseline).
WITH own AS (
    SELECT g.id, g.run_id, g.step, g.problem_id
    FROM attempts a
    JOIN rollout_groups g ON g.id = a.group_id
    WHERE a.id = :attempt_id
),
groups_at_key AS (
    SELECT id FROM own
    UNION
    SELECT g.id FROM rollout_groups g JOIN own o ON g.run_id = o.run_id AND g.step = o.step AND g.problem_id = o.problem_id
)
SELECT DISTINCT gc.experience_version_id
FROM group_contexts gc
WHERE gc.group_id IN (SELECT id FROM groups_at_key) AND gc.experience_version_id IS NOT NULL
ORDER BY 1
