with p as (
  select r.name run, g.problem_id, avg(a.correct::int)::numeric acc, avg((a.response like '%\boxed{%')::int)::numeric boxed
  from attempts a join rollout_groups g on g.id = a.group_id join runs r on r.id = g.run_id
  where r.name like 'grpo-vs-lanpo-heldout-%' and r.name not like '%-greedy' group by 1, 2),
pairs(a, b) as (values ('sft-start','grpo'), ('sft-start','lanpo-both'), ('sft-start','mel'), ('grpo','lanpo-both'), ('grpo','mel'))
select pairs.b || ' - ' || pairs.a as diff, count(*) n, round(avg(y.acc - x.acc), 4) mean, round((stddev(y.acc - x.acc) / sqrt(count(*)))::numeric, 4) se,
       sum((y.acc > x.acc)::int) up, sum((y.acc < x.acc)::int) down, round(avg(y.boxed), 3) boxed_b
from pairs join p x on x.run = 'grpo-vs-lanpo-heldout-' || pairs.a join p y on y.run = 'grpo-vs-lanpo-heldout-' || pairs.b and y.problem_id = x.problem_id
group by pairs.a, pairs.b order by 1
