-- Issue 64's reuse check (train/experiments/reuse-value-chain-sum.toml): does a run's held-out deficit to GRPO grow
-- with how many of its groups carried a context? Per run of every arm but GRPO (the null arm grpo-fp32 at 0): its
-- intra and inter groups (of the 80 a 10-step run trains), its held-out mean at the last validation less GRPO's of the same seed (paired by
-- problem, as reuse_value.sql), and over those runs the least-squares slope of that difference on the contexted
-- groups, with the correlation: across all runs (row `all`), and within seeds (row `within seeds`: each run's
-- difference and exposure less its seed's means, so that a seed whose GRPO run is strong, leaving every arm behind
-- it, does not pass for an effect of exposure).
--
--   lanpo sql --file docs/learning/reuse_exposure.sql
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
diff as (
  select f.arm, f.seed, 100 * avg(f.acc - g.acc) points
  from final f join final g on g.arm = 'grpo' and g.seed = f.seed and g.problem_id = f.problem_id
  where f.arm <> 'grpo'
  group by 1, 2),
exposure as (
  select substring(r.name from '^reuse-value-chain-sum-(.*)-s[0-9]+$') arm,
         cast(substring(r.name from '-s([0-9]+)$') as int) seed,
         count(*) filter (where g.mode = 'intra') intra, count(*) filter (where g.mode = 'inter') inter
  from runs r join rollout_groups g on g.run_id = r.id
  where r.name ~ '^reuse-value-chain-sum-.*-s[0-9]+$'
  group by 1, 2),
runs as (select d.arm, d.seed, e.intra, e.inter, e.intra + e.inter contexted, d.points
         from diff d join exposure e using (arm, seed)),
within as (select points - avg(points) over (partition by seed) points,
                  contexted - avg(contexted) over (partition by seed) contexted from runs)
select * from (
  select arm, cast(seed as text) seed, intra, inter, contexted, round(points, 1) minus_grpo_points,
         null::numeric slope, null::numeric r
  from runs
  union all  -- the last row: over the runs above, how many, and the slope (points per contexted group) and r
  select 'all', cast(count(*) as text), null, null, null, null,
         round(cast(regr_slope(points, contexted) as numeric), 2), round(cast(corr(points, contexted) as numeric), 2)
  from runs
  union all
  select 'within seeds', cast(count(*) as text), null, null, null, null,
         round(cast(regr_slope(points, contexted) as numeric), 2), round(cast(corr(points, contexted) as numeric), 2)
  from within) t
order by arm in ('all', 'within seeds'), arm, seed;
