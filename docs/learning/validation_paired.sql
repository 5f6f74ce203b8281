-- Paired differences on the learning experiment's in-training validation (train/experiments/grpo-vs-lanpo.toml:
-- eval.n held-out problems x eval.k samples at steps 0, 10 and 20 of every run), from the stored attempts.
--
--   lanpo sql --file docs/learning/validation_paired.sql
--
-- A problem's accuracy is its mean over the k samples. Validation samples are seeded by problem and seed, so the
-- step-0 answers (the SFT start) are the same in every arm of a seed, and the arms of a seed answer with the same
-- random numbers. Rows:
--   <arm> step S - step 0   the arm's gain over the start at step S, paired by problem within each seed;
--   lanpo-both - grpo       at step S, same seed, paired by problem.
-- seed 'all' first averages each problem's difference over the seeds, so its se_problems is over problems only;
-- se_seeds is the spread of the seed means (stddev / sqrt(seeds)), which also carries run-to-run variation: the
-- larger of the two is the honest error bar.
with acc as (
  select regexp_replace(run_name, '^grpo-vs-lanpo-(.*)-s[0-9]+$', '\1') arm,
         substring(run_name from '-s([0-9]+)$') seed, step, problem_id, avg(correct::int)::numeric acc
  from run_attempts
  where mode = 'val' and run_name ~ '^grpo-vs-lanpo-(grpo|lanpo-both|mel)-s[0-9]+$'
  group by 1, 2, 3, 4),
d as (
  select y.arm || ' step ' || y.step || ' - step 0' diff, y.seed, y.problem_id, y.acc - x.acc value
  from acc y join acc x using (arm, seed, problem_id) where x.step = 0 and y.step > 0
  union all
  select 'lanpo-both - grpo at step ' || y.step, y.seed, y.problem_id, y.acc - x.acc
  from acc y join acc x using (seed, step, problem_id) where y.arm = 'lanpo-both' and x.arm = 'grpo' and y.step > 0),
per_seed as (
  select diff, seed, count(*) n, avg(value) mean, stddev(value) / sqrt(count(*)) se,
         sum((value > 0)::int) up, sum((value < 0)::int) down
  from d group by diff, seed),
seeds as (select diff, count(*) k, stddev(mean) / sqrt(count(*)) se_seeds from per_seed group by diff),
pooled as (
  select d.diff, d.problem_id, avg(d.value) value from d join seeds using (diff)
  group by d.diff, d.problem_id, seeds.k having count(*) = seeds.k)  -- problems every seed answered
select diff, 's' || seed seed, n, round(mean, 4) mean, round(se::numeric, 4) se_problems, null se_seeds, up, down
from per_seed
union all
select p.diff, 'all', count(*), round(avg(p.value), 4), round((stddev(p.value) / sqrt(count(*)))::numeric, 4),
       round(s.se_seeds::numeric, 4), sum((p.value > 0)::int), sum((p.value < 0)::int)
from pooled p join seeds s using (diff) where s.k > 1 group by p.diff, s.se_seeds
order by diff, seed;
