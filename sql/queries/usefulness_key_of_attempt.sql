-- The (run, step, problem) key of attempt :attempt_id's rollout group (run and step may be NULL): where a verdict on
-- it can change lesson uses (its own group's, and, on a zero-shot attempt, those its baseline serves).
SELECT g.run_id, g.step, g.problem_id
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
WHERE a.id = :attempt_id
