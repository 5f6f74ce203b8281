-- Eviction counts by capacity policy (scope:policy), with the mean age of an experience when it left.
SELECT evicted_by, count(*) AS evicted,
       avg(evicted_at - created_at) AS mean_age_at_eviction,
       round(CAST(avg(reward) AS numeric), 3) AS mean_reward
FROM experiences
WHERE evicted_at IS NOT NULL
GROUP BY evicted_by
ORDER BY evicted DESC;
