-- Reward curves: per run and step, per attempt mode and over all modes (mode = 'all').
-- accuracy: share of attempts with correct = true among those graded; format_rate likewise for format_ok.
-- Replayed attempts (mode 'replayed': stored trajectories trained on again, never generated) are no fresh rollouts
-- and count in no row here: the `replays` view lists them.
CREATE OR REPLACE VIEW run_rewards AS
SELECT g.run_id, r.name AS run_name, g.step,
       CASE WHEN GROUPING(g.mode) = 1 THEN 'all' ELSE g.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN runs r ON r.id = g.run_id
WHERE g.mode <> 'replayed'
GROUP BY GROUPING SETS ((g.run_id, r.name, g.step, g.mode), (g.run_id, r.name, g.step));
