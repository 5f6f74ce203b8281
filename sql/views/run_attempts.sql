-- Every attempt with its group's run, step, problem, mode and template (the prompt text is the group's:
-- JOIN rollout_groups g ON g.id = group_id for it), the adapter that served it, and its grade.
CREATE OR REPLACE VIEW run_attempts AS
SELECT a.id AS attempt_id, a.group_id, g.run_id, r.name AS run_name, g.step, g.problem_id, p.dataset,
       p.external_id, g.mode, g.prompt_version, g.policy_version_id, a.served_adapter_sha256, a.response,
       a.reward, a.correct, a.format_ok, g.prompt_tokens, a.completion_tokens, a.created_at
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
JOIN problems p ON p.id = g.problem_id
LEFT JOIN runs r ON r.id = g.run_id;
