-- The lesson versions used (named in a group's context) by a rollout group at any of the given (run, step, problem)
-- keys, in id order: the versions whose lesson_usefulness a new group, verdict or zero-shot baseline at a key can
-- change. The keys come as three arrays of one length, none NULL (a group without a run or step never has a
-- baseline: only its own versions change, and its writer knows them).
SELECT DISTINCT gc.experience_version_id
FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
     AS k(run_id, step, problem_id)
JOIN rollout_groups g ON g.run_id = k.run_id AND g.step = k.step AND g.problem_id = k.problem_id
JOIN group_contexts gc ON gc.group_id = g.id
WHERE gc.experience_version_id IS NOT NULL
ORDER BY 1
