-- The lesson versions used (named in a group's context) by a rollout group whose lesson_uses row a new group, verdict
-- or zero-shot baseline at any of the given (run, step, problem) keys can change, in id order: the groups at those
-- keys, and in a training run every group at a step after the earliest key's (a zero-shot group at step s enters the
-- estimated baseline of later steps' uses: usefulness_uses_recompute.sql). In training no later step is written yet,
-- so this finds nothing more: a step written group by group recomputes only the groups at each write's keys. The keys come as three arrays of one length, none NULL (a group
-- without a run or step never has a baseline: only its own versions change, and its writer knows them).
WITH keys AS (
    SELECT * FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
         AS k(run_id, step, problem_id)
),
groups AS (
    SELECT g.id
    FROM keys k
    JOIN rollout_groups g ON g.run_id = k.run_id AND g.step = k.step AND g.problem_id = k.problem_id
    UNION
    SELECT g.id
    FROM (SELECT k.run_id, min(k.step) AS step FROM keys k JOIN runs r ON r.id = k.run_id AND r.kind = 'train'
          GROUP BY k.run_id) t
    JOIN rollout_groups g ON g.run_id = t.run_id AND g.step > t.step
)
SELECT DISTINCT gc.experience_version_id
FROM groups g
JOIN group_contexts gc ON gc.group_id = g.id
WHERE gc.experience_version_id IS NOT NULL
ORDER BY 1
