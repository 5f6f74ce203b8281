-- The lesson versions used (named in a group's context) by a rollout group at any of the given (run, step, problem)
-- keys, in id order: the versions whose lesson_usefulness a new group, verdict or zero-shot baseline at a key can
-- change. The keys come as three arrays of one length; a NULL run or step matches a NULL (such a use never has a
-- baseline, but it is still a use).
SELECT DISTINCT gc.experience_version_id
FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
     AS k(run_id, step, problem_id)
JOIN rollout_groups g
  ON g.problem_id = k.problem_id AND g.run_id IS NOT DISTINCT FROM k.run_id AND g.step IS NOT DISTINCT FROM k.step
JOIN group_contexts gc ON gc.group_id = g.id
WHERE gc.experience_version_id IS NOT NULL
ORDER BY 1
