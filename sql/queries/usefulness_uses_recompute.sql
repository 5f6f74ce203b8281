-- Recompute the lesson_uses rows of the uses of the given versions by the rollout groups at the given keys: (run,
-- step, problem) as three arrays of one length, none NULL, and the groups :loose_group_ids (groups without a run or
-- a step: they never have a baseline). Run it after usefulness_lock.sql, in a
-- new statement (it reads the uses committed while it waited), then usefulness_recompute.sql. A use is one rollout
-- group whose context holds the version (m times: m positions, almost always 1) among k experience items. Its graded
-- attempts are those with a correctness: attempts.correct, else the attempt's latest answer_feedback verdict. Its
-- baseline: the zero-shot attempts with a correctness of the same run, step, problem and policy version
-- (experience_usage's estimator). Outcome: NULL (unknown) without a baseline or a graded attempt; else 1 / -1 / 0
-- (helped / hurt / even) as the group's accuracy is above / below / equal to the baseline's (compared exactly, in
-- integers). graded = m * graded attempts, credit = m * sum(correct - baseline) / k over them (uses with a
-- baseline; else 0), so a version's credit / graded is experience_usage.lift. A row that would not change is left
-- alone.
WITH groups AS (
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
         AS k(run_id, step, problem_id)
    JOIN rollout_groups g ON g.run_id = k.run_id AND g.step = k.step AND g.problem_id = k.problem_id
    UNION ALL
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM rollout_groups g
    WHERE g.id = ANY(CAST(:loose_group_ids AS bigint[]))
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) AS m,
           sum(count(*)) OVER (PARTITION BY gc.group_id) AS k
    FROM groups g
    JOIN group_contexts gc ON gc.group_id = g.id
    WHERE gc.experience_version_id IS NOT NULL
    GROUP BY gc.group_id, gc.experience_version_id
),
uses AS (
    SELECT * FROM items WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
),
scored AS (
    SELECT g.id AS group_id, own.n, own.hits, zs.n AS zn, zs.hits AS zhits
    FROM groups g
    CROSS JOIN LATERAL (
        SELECT count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
        FROM attempts a
        CROSS JOIN LATERAL (
            SELECT CAST(coalesce(a.correct, (
                SELECT f.correct FROM answer_feedback f
                WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
                ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
        ) x
        WHERE a.group_id = g.id
    ) own
    CROSS JOIN LATERAL (
        SELECT count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
        FROM rollout_groups z
        JOIN attempts a ON a.group_id = z.id
        CROSS JOIN LATERAL (
            SELECT CAST(coalesce(a.correct, (
                SELECT f.correct FROM answer_feedback f
                WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
                ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
        ) x
        WHERE z.mode = 'zero_shot' AND z.run_id = g.run_id AND z.step = g.step AND z.problem_id = g.problem_id
          AND z.policy_version_id IS NOT DISTINCT FROM g.policy_version_id
    ) zs
    WHERE g.id IN (SELECT group_id FROM uses)
)
INSERT INTO lesson_uses AS lu (version_id, group_id, m, outcome, graded, credit)
SELECT u.version_id, u.group_id, u.m,
       CASE WHEN s.zn = 0 OR s.n = 0 THEN NULL ELSE CAST(sign(s.hits * s.zn - s.zhits * s.n) AS smallint) END,
       CASE WHEN s.zn = 0 THEN 0 ELSE u.m * s.n END,
       CASE WHEN s.zn = 0 OR s.n = 0 THEN 0
            ELSE u.m * (s.hits - s.n * (CAST(s.zhits AS double precision) / s.zn)) / u.k END
FROM uses u
JOIN scored s ON s.group_id = u.group_id
ORDER BY u.version_id, u.group_id
ON CONFLICT (version_id, group_id) DO UPDATE
SET m = EXCLUDED.m, outcome = EXCLUDED.outcome, graded = EXCLUDED.graded, credit = EXCLUDED.credit
WHERE (lu.m, lu.outcome, lu.graded, lu.credit) IS DISTINCT FROM
      (EXCLUDED.m, EXCLUDED.outcome, EXCLUDED.graded, EXCLUDED.credit)
