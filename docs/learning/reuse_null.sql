-- Issue 64's reuse check (train/experiments/reuse-value-chain-sum.toml) against two runs of GRPO a seed: `grpo` and
-- the null arm `grpo-fp32` (GRPO with its forwards in float32: the same method with other rounding). Per arm over the
-- seeds both GRPO runs reached: its held-out difference, in points, to `grpo`, to `grpo-fp32`, and to their mean
-- (paired by (problem, seed), as reuse_value.sql), each with its standard error. The null arm's own row against
-- `grpo` is how far two runs of one method land apart; the mean of the two is GRPO measured twice a seed.
--
--   lanpo sql --file docs/learning/reuse_null.sql
with acc as (
  select substring(run_name from '^reuse-value-chain-sum-(.*)-s[0-9]+$') arm,
         cast(substring(run_name from '-s([0-9]+)$') as int) seed,
         step, problem_id, avg(correct::int)::numeric acc
  from run_attempts
  where mode = 'val' and run_name ~ '^reuse-value-chain-sum-.*-s[0-9]+$'
  group by 1, 2, 3, 4),
last as (select arm, seed, max(step) step from acc group by 1, 2),
done as (select * from last where step = (select max(step) from last)),
final as (select a.* from acc a join done using (arm, seed, step)),
paired as (
  select f.arm, f.seed, 100 * (f.acc - g.acc) vs_grpo, 100 * (f.acc - n.acc) vs_null,
         100 * (f.acc - (g.acc + n.acc) / 2) vs_both
  from final f
  join final g on g.arm = 'grpo' and g.seed = f.seed and g.problem_id = f.problem_id
  join final n on n.arm = 'grpo-fp32' and n.seed = f.seed and n.problem_id = f.problem_id)
select arm, count(distinct seed) seeds, count(*) pairs,
       round(avg(vs_grpo), 1) minus_grpo, round(stddev(vs_grpo) / cast(sqrt(count(*)) as numeric), 1) se,
       round(avg(vs_null), 1) minus_null, round(stddev(vs_null) / cast(sqrt(count(*)) as numeric), 1) se,
       round(avg(vs_both), 1) minus_both, round(stddev(vs_both) / cast(sqrt(count(*)) as numeric), 1) se
from paired
where arm not in ('grpo')
group by arm
order by arm = 'grpo-fp32' desc, arm;
