-- Every group that uses a lesson, with its (run, step, problem) key: usefulness.rebuild recomputes them all (the keys
-- of groups with a run and a step; the others by group id).
SELECT DISTINCT g.id AS group_id, g.run_id, g.step, g.problem_id
FROM rollout_groups g
WHERE EXISTS (SELECT 1 FROM group_contexts c WHERE c.group_id = g.id AND c.experience_version_id IS NOT NULL)
