-- The lesson versions used by a rollout group at the (run, step, problem) key of attempt :attempt_id's group, in id
-- order: those whose outcomes a verdict on that attempt can change (as a use's grade, or in a zero-shot baseline).
SELECT DISTINCT gc.experience_version_id
FROM attempts a
JOIN rollout_groups g0 ON g0.id = a.group_id
JOIN rollout_groups g
  ON g.problem_id = g0.problem_id AND g.run_id IS NOT DISTINCT FROM g0.run_id AND g.step IS NOT DISTINCT FROM g0.step
JOIN group_contexts gc ON gc.group_id = g.id
WHERE a.id = :attempt_id AND gc.experience_version_id IS NOT NULL
ORDER BY 1
