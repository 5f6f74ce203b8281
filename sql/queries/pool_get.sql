-- One pool by name, with its capacity settings.
SELECT id, name, per_problem_cap, per_step_cap, global_cap, eviction, created_at, min_uses, merge_threshold,
       merge_keeps, max_policy_age, baseline_half_life, baseline_prior, retire_below
FROM pools WHERE name = :name
