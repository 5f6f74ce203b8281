-- The reuse experiment (train/experiments/reuse-value-chain-sum.toml), issue 64: what an intra gate paired by problem
-- would have estimated. Each intra group is set against the same problem's latest earlier zero-shot group of its run;
-- at each step from 6, over the intra groups of the steps before it: their number, the mean paired difference (the
-- lift), its standard error, and the bound mean + 1.96 se with no prior (below 0: the gate would close). Runs of the
-- value and gate arms. docs/log.md, "seeds 4 and 5 on the Xeon".
--
--   lanpo sql --file docs/learning/reuse_intra_paired.sql
with g as (
  select r.name run, g.id, g.step, g.problem_id, g.mode, avg(a.correct::int)::numeric acc
  from rollout_groups g join runs r on r.id = g.run_id join attempts a on a.group_id = g.id
  where r.name ~ '^reuse-value-chain-sum-lanpo-both-value(-gate)?-s[0-5]$' and g.mode in ('intra', 'zero_shot')
  group by 1, 2, 3, 4, 5),
d as (
  select i.run, i.step, i.acc - b.acc diff
  from g i cross join lateral (
    select z.acc from g z where z.run = i.run and z.problem_id = i.problem_id and z.mode = 'zero_shot' and z.step < i.step
    order by z.step desc limit 1) b
  where i.mode = 'intra'),
steps as (select distinct run, step from g)
select right(s.run, 7) run, s.step, count(d.diff) n, round(avg(d.diff), 3) lift,
       round((stddev(d.diff) / sqrt(count(d.diff)))::numeric, 3) se,
       round((avg(d.diff) + 1.96 * stddev(d.diff) / sqrt(count(d.diff)))::numeric, 3) ucb_no_prior
from steps s left join d on d.run = s.run and d.step < s.step
where s.step >= 6
group by 1, 2 order by 1, 2;
