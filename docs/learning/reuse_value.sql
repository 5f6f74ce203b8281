-- Issue 64's reuse check (train/experiments/reuse-value-chain-sum.toml): GRPO, LANPO-both and LANPO-both with lessons
-- on probation (lanpo-both-value; lanpo-both-value-pool with the pool's prior; lanpo-both-value-gate with the intra
-- gate), each at seeds 0-4. Per arm and seed, and over the seeds: the held-out mean at the last validation with a
-- standard error over problems, and the difference to GRPO of the same seed, paired by problem (validation samples are
-- seeded by problem and seed, so the arms of a seed answer with the same random numbers); over the seeds the pairs are
-- (problem, seed). Only runs that reached the experiment's last validation count.
--
--   lanpo sql --file docs/learning/reuse_value.sql
--
-- A problem's accuracy is its mean over the eval.k samples; se is stddev over pairs / sqrt(pairs).
with acc as (
  select substring(run_name from '^reuse-value-chain-sum-(.*)-s[0-9]+$') arm,
         cast(substring(run_name from '-s([0-9]+)$') as int) seed,
         step, problem_id, avg(correct::int)::numeric acc
  from run_attempts
  where mode = 'val' and run_name ~ '^reuse-value-chain-sum-.*-s[0-9]+$'
  group by 1, 2, 3, 4),
last as (select arm, seed, max(step) step from acc group by 1, 2),
-- a run stopped before its last validation (its latest is an earlier step) is left out, not compared at that step
done as (select * from last where step = (select max(step) from last)),
final as (select a.* from acc a join done using (arm, seed, step)),
paired as (
  select f.arm, f.seed, f.problem_id, f.acc, f.acc - g.acc diff
  from final f join final g on g.arm = 'grpo' and g.seed = f.seed and g.problem_id = f.problem_id)
select arm, coalesce(cast(seed as text), 'all') seed, count(*) pairs,
       round(avg(acc), 4) mean, round((stddev(acc) / sqrt(count(*)))::numeric, 4) se,
       round(avg(diff), 4) minus_grpo, round((stddev(diff) / sqrt(count(*)))::numeric, 4) se_grpo
from paired
group by grouping sets ((arm, seed), (arm))
order by arm = 'grpo' desc, arm, seed nulls last;
