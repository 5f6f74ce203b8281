-- The reuse experiments (train/experiments/reuse-chain-sum.toml, reuse-hidden-rule.toml): every arm's held-out
-- mean at its last validation with a standard error over problems, its gain over the shared start (step 0), and its
-- difference to GRPO, paired by problem (validation samples are seeded by problem and seed, so every arm of a seed
-- answers with the same random numbers).
--
--   lanpo sql --file docs/learning/reuse_paired.sql
--
-- A problem's accuracy is its mean over the eval.k samples; se is stddev over problems / sqrt(problems).
with acc as (
  select substring(run_name from '^(reuse-[a-z-]+?)-(?:grpo|lanpo-both|rlep|exgrpo|repo|leaked-intra|naive-inter-random|naive-inter-similar|mel)-s[0-9]+$') experiment,
         substring(run_name from '^reuse-(?:chain-sum|hidden-rule)-(.*)-s[0-9]+$') arm,
         step, problem_id, avg(correct::int)::numeric acc
  from run_attempts
  where mode = 'val' and run_name ~ '^reuse-(chain-sum|hidden-rule)-.*-s[0-9]+$'
  group by 1, 2, 3, 4),
last as (select experiment, arm, max(step) step from acc group by 1, 2),
final as (select a.* from acc a join last using (experiment, arm, step)),
start as (select * from acc where step = 0)
select f.experiment, f.arm, f.step, count(*) problems,
       round(avg(f.acc), 4) mean, round((stddev(f.acc) / sqrt(count(*)))::numeric, 4) se,
       round(avg(f.acc - s.acc), 4) minus_start, round((stddev(f.acc - s.acc) / sqrt(count(*)))::numeric, 4) se_start,
       round(avg(f.acc - g.acc), 4) minus_grpo, round((stddev(f.acc - g.acc) / sqrt(count(*)))::numeric, 4) se_grpo
from final f
join start s on s.experiment = f.experiment and s.arm = f.arm and s.problem_id = f.problem_id
join final g on g.experiment = f.experiment and g.arm = 'grpo' and g.problem_id = f.problem_id
group by f.experiment, f.arm, f.step
order by f.experiment, f.arm = 'grpo' desc, f.arm;
