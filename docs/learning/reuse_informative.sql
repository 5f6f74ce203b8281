-- The reuse experiment (train/experiments/reuse-value-chain-sum.toml), issue 64: per arm, the training groups GRPO
-- learns from (some rollouts right and some wrong: a group all right or all wrong has no advantage), of all its
-- training groups, and how many of each were contexted (intra or inter). docs/log.md, "seeds 4 and 5 on the Xeon".
--
--   lanpo sql --file docs/learning/reuse_informative.sql
with g as (
  select r.name run_name, g.id, g.mode, count(*) n, sum(a.correct::int) hits
  from rollout_groups g join runs r on r.id = g.run_id join attempts a on a.group_id = g.id
  where r.name ~ '^reuse-value-chain-sum-(grpo|lanpo-both-value|lanpo-both-value-gate)-s[0-9]+$' and g.mode <> 'val'
  group by 1, 2, 3)
select substring(run_name from '^reuse-value-chain-sum-(.*)-s[0-9]+$') arm,
       count(*) filter (where hits > 0 and hits < n) informative,
       count(*) filter (where mode <> 'zero_shot' and hits > 0 and hits < n) informative_ctx,
       count(*) filter (where mode <> 'zero_shot') ctx, count(*) groups,
       count(distinct run_name) runs
from g group by 1 order by 1;
