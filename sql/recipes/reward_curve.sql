-- Reward curve of every run: mean reward and accuracy per step over all modes, next to the feedback modes.
SELECT run_name, step,
       max(mean_reward) FILTER (WHERE mode = 'all') AS reward,
       max(accuracy) FILTER (WHERE mode = 'all') AS accuracy,
       max(mean_reward) FILTER (WHERE mode = 'zero_shot') AS zero_shot,
       max(mean_reward) FILTER (WHERE mode = 'intra') AS intra,
       max(mean_reward) FILTER (WHERE mode = 'inter') AS inter
FROM run_rewards
GROUP BY run_id, run_name, step
ORDER BY run_name, step;
