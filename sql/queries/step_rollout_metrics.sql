-- A step's rollout metrics read back from its rows (its groups were written one by one, or in batches): mean
-- reward, accuracy, format and length over its attempts, the rollouts per mode, and the lessons it added. With
-- :trained, over the groups the step trained (consumed_step, not dropped: verl's asynchronous modes train groups
-- that earlier steps wrote) instead of the groups written at it.
SELECT avg(a.reward) AS reward,
       avg(a.correct::int) AS accuracy,
       avg(a.format_ok::int) AS format,
       avg(a.completion_tokens) AS length,
       count(*) AS rollouts,
       count(*) FILTER (WHERE g.mode = 'zero_shot') AS zero_shot,
       count(*) FILTER (WHERE g.mode = 'intra') AS intra,
       count(*) FILTER (WHERE g.mode = 'inter') AS inter,
       (SELECT count(*) FROM experiences e WHERE e.run_id = :run_id AND e.step = :step) AS added
FROM rollout_groups g
JOIN attempts a ON a.group_id = g.id
WHERE g.run_id = :run_id
  AND CASE WHEN :trained THEN g.consumed_step = :step AND g.dropped IS NULL ELSE g.step = :step END
