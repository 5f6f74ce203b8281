-- Reward curves: per run and step, per attempt mode and over all modes (mode = 'all').
-- accuracy: share of attempts with correct = true among those graded; format_rate likewise for format_ok.
CREATE OR REPLACE VIEW run_rewards AS
SELECT a.run_id, r.name AS run_name, a.step,
       CASE WHEN GROUPING(a.mode) = 1 THEN 'all' ELSE a.mode END AS mode,
       count(*) AS attempts,
       avg(a.reward) AS mean_reward,
       avg(CAST(a.correct AS integer)) AS accuracy,
       avg(CAST(a.format_ok AS integer)) AS format_rate
FROM attempts a
JOIN runs r ON r.id = a.run_id
GROUP BY GROUPING SETS ((a.run_id, r.name, a.step, a.mode), (a.run_id, r.name, a.step));
