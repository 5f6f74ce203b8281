-- Bulk load of rollout groups (one prompt each) with ids reserved by reserve_ids.sql (binary rows).
COPY rollout_groups (id, run_id, problem_id, step, policy_version_id, mode, prompt, prompt_version, prompt_tokens)
FROM STDIN (FORMAT BINARY)
