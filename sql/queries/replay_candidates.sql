-- The stored trajectories a step may replay: attempts of zero_shot groups (the prompt is the question alone, so the
-- stored behaviour log-probs are of the very prompt a replay trains under) of the runs :run_ids, on the problems
-- :problem_ids, at steps before :before_step (the run :this_run's own; every step of another run, e.g. RLEP's
-- earlier run), that have stored tokens and are not replays themselves; graded ones
-- only, and the correct ones only when :successes_only. Each with its group's prompt, template and prompt tokens,
-- its grade and its tokens with their behaviour log-probs. Ordered by problem, then oldest first (step, attempt id).
SELECT a.id AS attempt_id, g.problem_id, g.run_id, g.step, g.prompt, g.prompt_version, g.prompt_tokens,
       a.response, a.reward, a.correct, a.format_ok, t.token_ids, t.logprobs, t.logprobs_of, a.completion_tokens,
       a.created_at
FROM rollout_groups g
JOIN attempts a ON a.group_id = g.id
JOIN attempt_tokens t ON t.attempt_id = a.id
WHERE g.mode = 'zero_shot' AND g.run_id = ANY(CAST(:run_ids AS bigint[]))
  AND g.problem_id = ANY(CAST(:problem_ids AS bigint[])) AND (g.step < :before_step OR (CAST(:this_run AS bigint) IS NOT NULL AND g.run_id <> CAST(:this_run AS bigint)))
  AND a.replay_of IS NULL AND a.correct IS NOT NULL AND (a.correct OR NOT CAST(:successes_only AS boolean))
ORDER BY g.problem_id, g.step, a.id
