-- Per experience version: how often it was put into a prompt, and how much the attempts that carried it gained in
-- correctness over the problem's zero-shot success under the same weights. The estimator:
--   a use is one attempt whose group's context holds the version (inter prompts in training, retrieval answers);
--   its baseline is its group's lesson_uses.baseline (usefulness_uses_recompute.sql, docs/concepts.md): exact, the
--   mean correctness of the zero-shot attempts on the same problem in the same run at the same step and policy
--   version (`lanpo eval` and serving answer a question both ways; a training step where a problem was drawn twice);
--   or, in a training run, estimated from the run's zero-shot attempts at the few steps before its own (the
--   problem's own, shrunk toward all problems', nearer steps weighing more). A use with neither has no baseline;
--   its gain is correct - baseline, with correct from attempts.correct (1 or 0), or, where the grader left it NULL
--   (a served answer has no gold answer), the attempt's latest answer_feedback verdict (`POST /v1/feedback`; a
--   later verdict replaces an earlier one, a reward-only feedback row gives none). The same correctness counts in
--   the zero-shot baselines. The reward is not used: it holds the 0.1 format bonus, which a feedback prompt can
--   earn and a zero-shot one cannot;
--   a context of k experience items shares its gain: each item is credited gain / k, so the credits of one
--   context's items add up to that context's gain, and no item is credited its neighbours' effect in full;
--   lift = the mean credited gain over the graded uses with a baseline = sum(gain / k) / uses_with_baseline, equal
--   to lesson_usefulness.credit / graded.
-- times_injected counts every use and problems their distinct problems; accuracy_with and zero_shot_accuracy are
-- plain means over the uses_with_baseline, so lift = accuracy_with - zero_shot_accuracy where every context held
-- one item. Ungraded attempts (correct NULL) are left out of all three. Versions never used appear with 0 uses.
CREATE OR REPLACE VIEW experience_usage AS
WITH verdicts AS (
    SELECT DISTINCT ON (f.attempt_id) f.attempt_id, f.correct
    FROM answer_feedback f
    WHERE f.correct IS NOT NULL
    ORDER BY f.attempt_id, f.created_at DESC, f.id DESC
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) OVER (PARTITION BY gc.group_id) AS k
    FROM group_contexts gc
    WHERE gc.experience_version_id IS NOT NULL
),
uses AS (
    SELECT i.version_id, a.id AS attempt_id, g.problem_id, i.k,
           CAST(CAST(coalesce(a.correct, vd.correct) AS integer) AS double precision) AS correct,
           lu.baseline
    FROM items i
    JOIN rollout_groups g ON g.id = i.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN verdicts vd ON vd.attempt_id = a.id
    LEFT JOIN lesson_uses lu ON lu.version_id = i.version_id AND lu.group_id = i.group_id
)
SELECT v.id AS version_id, v.experience_id, v.version, e.pool_id, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       count(u.correct - u.baseline) AS uses_with_baseline,
       avg(u.correct) FILTER (WHERE u.baseline IS NOT NULL) AS accuracy_with,
       avg(u.baseline) FILTER (WHERE u.correct IS NOT NULL) AS zero_shot_accuracy,
       avg((u.correct - u.baseline) / u.k) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.pool_id, e.problem_id, e.evicted_at;
