-- Per problem of :problem_ids, its latest correctness (ExGRPO buckets questions by it): the mean correctness of its
-- FRESH graded attempts (zero_shot, intra and inter groups; never a replay, a validation or a test-time answer) in
-- the runs :run_ids at the latest step before :before_step (in :this_run; any step of another run) at which any of
-- those runs graded it (all of those runs' attempts at that step count). A problem never graded there has no row.
WITH fresh AS (
    SELECT g.problem_id, g.step, a.correct
    FROM rollout_groups g
    JOIN attempts a ON a.group_id = g.id
    WHERE g.mode IN ('zero_shot', 'intra', 'inter') AND a.replay_of IS NULL AND a.correct IS NOT NULL
      AND g.run_id = ANY(CAST(:run_ids AS bigint[])) AND g.problem_id = ANY(CAST(:problem_ids AS bigint[]))
      AND (g.step < :before_step OR (CAST(:this_run AS bigint) IS NOT NULL AND g.run_id <> CAST(:this_run AS bigint)))
),
latest AS (
    SELECT problem_id, max(step) AS step FROM fresh GROUP BY problem_id
)
SELECT f.problem_id, avg(CAST(CAST(f.correct AS integer) AS double precision)) AS correctness
FROM fresh f
JOIN latest l ON l.problem_id = f.problem_id AND l.step = f.step
GROUP BY f.problem_id
ORDER BY f.problem_id
