-- Eviction counts per pool and capacity policy (scope:policy), with the mean age of an experience when it left.
SELECT pl.name AS pool, e.evicted_by, count(*) AS evicted,
       avg(e.evicted_at - e.created_at) AS mean_age_at_eviction,
       round(CAST(avg(e.reward) AS numeric), 3) AS mean_reward
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
WHERE e.evicted_at IS NOT NULL
GROUP BY pl.name, e.evicted_by
ORDER BY pl.name, evicted DESC;
