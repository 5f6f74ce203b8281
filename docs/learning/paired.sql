-- Paired held-out differences of the learning experiment's final policies, from the eval runs' stored attempts
-- (train/experiments/grpo-vs-lanpo-heldout.toml: one eval run `grpo-vs-lanpo-heldout-<arm>-s<seed>` per final
-- adapter, and `...-sft-start` for the start they share).
--
--   lanpo sql --file docs/learning/paired.sql
--
-- Each row compares policy b with policy a on the same problems: mean of b - a over problems (each problem's
-- accuracy is its mean over the k samples), its standard error, how many problems went up and down, and b's
-- boxed rate. Seed rows pair b and a of the same seed; `all` rows first average each problem's difference over
-- the seeds both arms have, so their standard error is over problems (seed-to-seed spread: the seed rows).
with per_problem as (
  select substring(r.name from length('grpo-vs-lanpo-heldout-') + 1) policy, g.problem_id,
         avg(a.correct::int)::numeric acc, avg((a.response like '%\boxed{%')::int)::numeric boxed
  from attempts a join rollout_groups g on g.id = a.group_id join runs r on r.id = g.run_id
  where r.name like 'grpo-vs-lanpo-heldout-%' and r.name not like '%-greedy' group by 1, 2),
p as (
  select policy, problem_id, acc, boxed,
         coalesce(substring(policy from '-s([0-9]+)$'), '') seed,
         regexp_replace(policy, '-s[0-9]+$', '') arm
  from per_problem),
pairs(a, b) as (values ('sft-start', 'grpo'), ('sft-start', 'lanpo-both'), ('sft-start', 'mel'),
                       ('grpo', 'lanpo-both'), ('grpo', 'mel'),
                       -- the LANPO-both runs of earlier format bonuses, kept under arms of their own
                       ('sft-start', 'lanpo-both-box-bonus'), ('grpo', 'lanpo-both-box-bonus'),
                       ('sft-start', 'lanpo-both-old-bonus'), ('grpo', 'lanpo-both-old-bonus')),
d as (
  select pairs.a, pairs.b, y.seed, y.problem_id, y.acc - x.acc diff, y.boxed
  from pairs join p y on y.arm = pairs.b
  join p x on x.arm = pairs.a and x.problem_id = y.problem_id and (x.seed = y.seed or pairs.a = 'sft-start')),
seeds as (select a, b, count(distinct seed) k from d group by a, b having count(distinct seed) > 1),
pooled as (select a, b, problem_id, avg(diff) diff, avg(boxed) boxed, count(*) k from d group by a, b, problem_id),
rows as (
  select b, a, 's' || seed seed, problem_id, diff, boxed from d
  union all  -- pooled over seeds: only pairs with 2+ seeds, only problems every one of those seeds answered
  select pooled.b, pooled.a, 'all', problem_id, diff, boxed from pooled join seeds using (a, b) where pooled.k = seeds.k)
select b || ' - ' || a diff, seed, count(*) n, round(avg(diff), 4) mean,
       round((stddev(diff) / sqrt(count(*)))::numeric, 4) se,
       sum((diff > 0)::int) up, sum((diff < 0)::int) down, round(avg(boxed), 3) boxed_b
from rows group by b, a, seed order by a desc, b, seed;
