-- Create a pool unless one of that name exists (a concurrent creator wins; the caller then reads it back).
INSERT INTO pools (name, per_problem_cap, per_step_cap, global_cap, eviction, min_uses, merge_threshold, merge_keeps,
                   max_policy_age, baseline_half_life, baseline_prior, retire_below)
VALUES (:name, :per_problem_cap, :per_step_cap, :global_cap, :eviction, :min_uses, :merge_threshold, :merge_keeps,
        :max_policy_age, :baseline_half_life, :baseline_prior, :retire_below)
ON CONFLICT (name) DO NOTHING
