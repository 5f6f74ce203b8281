-- Best experiences by lift: versions injected at least twice, ranked by mean reward gain over zero-shot.
SELECT u.version_id, u.source_problem_id, u.times_injected, round(CAST(u.mean_reward_with AS numeric), 3) AS with_ctx,
       round(CAST(u.zero_shot_mean_reward AS numeric), 3) AS zero_shot, round(CAST(u.lift AS numeric), 3) AS lift,
       left(v.summary, 80) AS summary
FROM experience_usage u
JOIN experience_versions v ON v.id = u.version_id
WHERE u.times_injected >= 2 AND u.lift IS NOT NULL
ORDER BY u.lift DESC, u.times_injected DESC
LIMIT 20;
