-- bench/usefulness.py's reference: the refresh as first written (commit c369e94), before per-use rows. It
-- recomputes each version's lesson_usefulness row from ALL its uses, so its cost grows with the version's history.
-- Recompute the lesson_usefulness rows of the given versions from the evidence (run it after usefulness_lock.sql,
-- in a new statement: under READ COMMITTED it sees every use committed while it waited). A use is one rollout group
-- whose context holds the version (m times: m positions, almost always 1) among k experience items. Its graded
-- attempts are those with a correctness: attempts.correct, else the attempt's latest answer_feedback verdict. Its
-- baseline: the zero-shot attempts with a correctness of the same run, step, problem and policy version
-- (experience_usage's estimator). Outcome: unknown without a baseline or a graded attempt; else helped / hurt /
-- even as the group's accuracy is above / below / equal to the baseline's (compared exactly, in integers).
-- graded = m * graded attempts, credit = m * sum(correct - baseline) / k over them (uses with a baseline), so
-- credit / graded is experience_usage.lift. A version with no use left gets zeros.
WITH targets AS (
    SELECT version_id FROM lesson_usefulness WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
),
uses AS (
    SELECT gc.experience_version_id AS version_id, gc.group_id, count(*) AS m,
           (SELECT count(*) FROM group_contexts c
            WHERE c.group_id = gc.group_id AND c.experience_version_id IS NOT NULL) AS k
    FROM group_contexts gc
    WHERE gc.experience_version_id = ANY(CAST(:version_ids AS bigint[]))
    GROUP BY gc.experience_version_id, gc.group_id
),
scored AS (
    SELECT u.version_id, u.group_id, u.m, u.k, own.n, own.hits, zs.n AS zn, zs.hits AS zhits
    FROM uses u
    JOIN rollout_groups g ON g.id = u.group_id
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
),
outcomes AS (
    SELECT version_id, group_id,
           CASE WHEN zn = 0 OR n = 0 THEN NULL ELSE sign(hits * zn - zhits * n) END AS outcome,
           CASE WHEN zn = 0 THEN 0 ELSE m * n END AS graded,
           CASE WHEN zn = 0 OR n = 0 THEN 0
                ELSE m * (hits - n * (CAST(zhits AS double precision) / zn)) / k END AS credit
    FROM scored
)
INSERT INTO lesson_usefulness AS lu (version_id, uses, helped, hurt, even, unknown, graded, credit, updated_at)
SELECT t.version_id,
       count(o.group_id),
       count(*) FILTER (WHERE o.outcome > 0),
       count(*) FILTER (WHERE o.outcome < 0),
       count(*) FILTER (WHERE o.outcome = 0),
       count(o.group_id) FILTER (WHERE o.outcome IS NULL),
       coalesce(sum(o.graded), 0),
       coalesce(sum(o.credit), 0),
       now()
FROM targets t
LEFT JOIN outcomes o ON o.version_id = t.version_id
GROUP BY t.version_id
ON CONFLICT (version_id) DO UPDATE
SET uses = EXCLUDED.uses, helped = EXCLUDED.helped, hurt = EXCLUDED.hurt, even = EXCLUDED.even,
    unknown = EXCLUDED.unknown, graded = EXCLUDED.graded, credit = EXCLUDED.credit, updated_at = EXCLUDED.updated_at
