-- Best experiences by lift: versions with at least two uses that have a zero-shot baseline (same problem, run, step
-- and policy version), ranked by their credited accuracy gain over it (a context's gain shared among its items;
-- the estimator is spelled out in sql/views/experience_usage.sql).
SELECT u.version_id, u.source_problem_id, u.times_injected, u.uses_with_baseline,
       round(CAST(u.accuracy_with AS numeric), 3) AS with_ctx,
       round(CAST(u.zero_shot_accuracy AS numeric), 3) AS zero_shot,
       round(CAST(u.lift AS numeric), 3) AS lift, left(v.summary, 80) AS summary
FROM experience_usage u
JOIN experience_versions v ON v.id = u.version_id
WHERE u.uses_with_baseline >= 2
ORDER BY u.lift DESC, u.uses_with_baseline DESC, u.version_id
LIMIT 20;
