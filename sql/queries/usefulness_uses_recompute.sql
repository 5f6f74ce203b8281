-- Recompute the lesson_uses rows of the uses of the given versions by the rollout groups at the given keys: (run,
-- step, problem) as three arrays of one length, none NULL; in a training run also every group at a step after the
-- run's earliest key (usefulness_versions_at.sql says why); and the groups :loose_group_ids (groups without a run
-- or a step: they never have a baseline). Run it after usefulness_lock.sql, in a new statement (it reads the uses
-- committed while it waited), then usefulness_recompute.sql.
--
-- A use is one rollout group whose context holds the version (m times: m positions, almost always 1) among k
-- experience items. Its graded attempts are those with a correctness: attempts.correct, else the attempt's latest
-- answer_feedback verdict. Its baseline b, the problem's zero-shot success under the same policy
-- (docs/concepts.md, "Usefulness per version"):
--   exact: the graded zero-shot attempts of the same run, step, problem and policy version, b = hits / n, n of
--     them (evaluation and serving answer a question both ways; training where a problem was drawn twice);
--   estimated, in a training run whose pool has baseline_half_life h > 0 and no exact baseline: the run's graded
--     zero-shot attempts at the steps s' before s, s - 4h <= s' < s (what the run knew when step s began: a use's
--     row depends on no write of its own step or a later one, so writing a step's groups one at a time recomputes
--     no other group's estimate), each weighted w = 0.5 ^ ((s - s') / h). The prior mean mu is the weighted success of all problems'
--     zero-shot attempts there, with the pool's baseline_prior kappa as its weight in attempts; the problem's own
--     weighted attempts (own_n, own_hits) update it: b = (kappa * mu + own_hits) / (kappa + own_n), worth
--     kappa + own_n attempts;
--   none (the use's outcome unknown): no exact baseline and no estimate (another kind of run, h = 0, the run has
--     no graded zero-shot attempt in the span, or kappa = 0 and the problem none of its own there).
-- Outcome: NULL (unknown) without a baseline or a graded attempt; else 1 / -1 / 0 (helped / hurt / even) as the
-- group's accuracy is above / below / equal to b (an exact one compared in integers). graded = m * graded attempts,
-- credit = m * sum(correct - b) / k over them (uses with a baseline; else 0), so a version's credit / graded is
-- experience_usage.lift. credit_var, the variance of credit: (m * n / k)^2 * (var(a) + var(b)), each the variance
-- of a Beta(successes + 1, failures + 1) over the group's n attempts and over b's attempts (never 0, so a version
-- with few uses has a wide interval). A row that would not change is left alone.
WITH keys AS (
    SELECT * FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
         AS k(run_id, step, problem_id)
),
groups AS (
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM keys k
    JOIN rollout_groups g ON g.run_id = k.run_id AND g.step = k.step AND g.problem_id = k.problem_id
    UNION
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM (SELECT k.run_id, min(k.step) AS step FROM keys k JOIN runs r ON r.id = k.run_id AND r.kind = 'train'
          GROUP BY k.run_id) t
    JOIN rollout_groups g ON g.run_id = t.run_id AND g.step > t.step
    UNION
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
used AS (
    SELECT g.* FROM groups g WHERE g.id IN (SELECT group_id FROM uses)
),
scored AS (  -- per used group: its graded attempts (n, hits) and its exact baseline's (zn, zhits)
    SELECT g.id AS group_id, own.n, own.hits, zs.n AS zn, zs.hits AS zhits
    FROM used g
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
settings AS (  -- the used groups of training runs whose pool estimates a missing baseline
    SELECT g.id AS group_id, g.run_id, g.step, g.problem_id,
           CAST(p.baseline_half_life AS double precision) AS h, CAST(p.baseline_prior AS double precision) AS kappa
    FROM used g
    JOIN scored s ON s.group_id = g.id AND s.zn = 0
    JOIN runs r ON r.id = g.run_id AND r.kind = 'train'
    JOIN pools p ON p.id = r.pool_id
    WHERE p.baseline_half_life > 0
),
spans AS (
    SELECT run_id, min(step - 4 * h) AS lo, max(step) - 1 AS hi FROM settings GROUP BY run_id
),
zsteps AS (  -- graded zero-shot attempts per (run, step, problem) within the spans, read once
    SELECT z.run_id, z.step, z.problem_id, count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
    FROM spans sp
    JOIN rollout_groups z ON z.run_id = sp.run_id AND z.step >= sp.lo AND z.step <= sp.hi AND z.mode = 'zero_shot'
    JOIN attempts a ON a.group_id = z.id
    CROSS JOIN LATERAL (
        SELECT CAST(coalesce(a.correct, (
            SELECT f.correct FROM answer_feedback f
            WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
            ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
    ) x
    GROUP BY z.run_id, z.step, z.problem_id
),
zall AS (
    SELECT run_id, step, sum(n) AS n, sum(hits) AS hits FROM zsteps GROUP BY run_id, step
),
prior AS (  -- per group: the weighted zero-shot attempts of every problem in its span
    SELECT e.group_id, sum(power(0.5, (e.step - z.step) / e.h) * z.n) AS n,
           sum(power(0.5, (e.step - z.step) / e.h) * z.hits) AS hits
    FROM settings e
    JOIN zall z ON z.run_id = e.run_id AND z.step < e.step AND z.step >= e.step - 4 * e.h
    GROUP BY e.group_id
),
mine AS (  -- per group: its problem's own weighted zero-shot attempts in its span
    SELECT e.group_id, sum(power(0.5, (e.step - z.step) / e.h) * z.n) AS n,
           sum(power(0.5, (e.step - z.step) / e.h) * z.hits) AS hits
    FROM settings e
    JOIN zsteps z ON z.run_id = e.run_id AND z.problem_id = e.problem_id AND z.step < e.step
                 AND z.step >= e.step - 4 * e.h
    GROUP BY e.group_id
),
based AS (  -- per used group: its baseline b, worth bn attempts, and where it came from (NULL: none)
    SELECT s.group_id, s.n, s.hits, s.zn, s.zhits,
           CASE WHEN s.zn > 0 THEN 'exact'
                WHEN pr.n > 0 AND e.kappa + coalesce(mi.n, 0) > 0 THEN 'estimated' END AS source,
           CASE WHEN s.zn > 0 THEN CAST(s.zhits AS double precision) / s.zn
                WHEN pr.n > 0 AND e.kappa + coalesce(mi.n, 0) > 0
                THEN (e.kappa * pr.hits / pr.n + coalesce(mi.hits, 0)) / (e.kappa + coalesce(mi.n, 0)) END AS b,
           CASE WHEN s.zn > 0 THEN CAST(s.zn AS double precision)
                WHEN pr.n > 0 AND e.kappa + coalesce(mi.n, 0) > 0 THEN e.kappa + coalesce(mi.n, 0) END AS bn
    FROM scored s
    LEFT JOIN settings e ON e.group_id = s.group_id
    LEFT JOIN prior pr ON pr.group_id = s.group_id
    LEFT JOIN mine mi ON mi.group_id = s.group_id
),
beta AS (  -- the Beta variances of the group's accuracy (va) and of its baseline (vb)
    SELECT d.*,
           (d.hits + 1.0) * (d.n - d.hits + 1.0) / ((d.n + 2.0) ^ 2 * (d.n + 3.0)) AS va,
           (d.b * d.bn + 1.0) * ((1.0 - d.b) * d.bn + 1.0) / ((d.bn + 2.0) ^ 2 * (d.bn + 3.0)) AS vb
    FROM based d
)
INSERT INTO lesson_uses AS lu (version_id, group_id, m, outcome, graded, credit, baseline, baseline_n,
                               baseline_source, credit_var)
SELECT u.version_id, u.group_id, u.m,
       CASE WHEN s.source IS NULL OR s.n = 0 THEN NULL
            WHEN s.source = 'exact' THEN CAST(sign(s.hits * s.zn - s.zhits * s.n) AS smallint)
            ELSE CAST(sign(s.hits - s.n * s.b) AS smallint) END,
       CASE WHEN s.source IS NULL THEN 0 ELSE u.m * s.n END,
       CASE WHEN s.source IS NULL OR s.n = 0 THEN 0 ELSE u.m * (s.hits - s.n * s.b) / u.k END,
       s.b, s.bn, s.source,
       CASE WHEN s.source IS NULL OR s.n = 0 THEN 0
            ELSE (CAST(u.m * s.n AS double precision) / u.k) ^ 2 * (s.va + s.vb) END
FROM uses u
JOIN beta s ON s.group_id = u.group_id
ORDER BY u.version_id, u.group_id
ON CONFLICT (version_id, group_id) DO UPDATE
SET m = EXCLUDED.m, outcome = EXCLUDED.outcome, graded = EXCLUDED.graded, credit = EXCLUDED.credit,
    baseline = EXCLUDED.baseline, baseline_n = EXCLUDED.baseline_n, baseline_source = EXCLUDED.baseline_source,
    credit_var = EXCLUDED.credit_var
WHERE (lu.m, lu.outcome, lu.graded, lu.credit, lu.baseline, lu.baseline_n, lu.baseline_source, lu.credit_var)
      IS DISTINCT FROM
      (EXCLUDED.m, EXCLUDED.outcome, EXCLUDED.graded, EXCLUDED.credit, EXCLUDED.baseline, EXCLUDED.baseline_n,
       EXCLUDED.baseline_source, EXCLUDED.credit_var)
