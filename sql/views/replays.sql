-- One row per replayed attempt (mode 'replayed': a stored trajectory of the same problem trained on again at a
-- step, never generated): its run, step, problem and group, the source attempt it copies (replay_of), the source's
-- run and step, its age in steps (step - source_step), the copied grade and completion tokens, and who computed the
-- source's stored behaviour log-probs (attempt_tokens.logprobs_of: engine | trainer). The source columns are NULL
-- once the source attempt is deleted.
CREATE OR REPLACE VIEW replays AS
SELECT g.run_id, r.name AS run_name, g.step, g.problem_id, a.group_id, a.id AS attempt_id,
       a.replay_of AS source_attempt_id, sg.run_id AS source_run_id, sr.name AS source_run_name,
       sg.step AS source_step, g.step - sg.step AS age, a.reward, a.correct, a.format_ok, a.completion_tokens,
       t.logprobs_of, a.created_at
FROM attempts a
JOIN rollout_groups g ON g.id = a.group_id
LEFT JOIN runs r ON r.id = g.run_id
LEFT JOIN attempts s ON s.id = a.replay_of
LEFT JOIN rollout_groups sg ON sg.id = s.group_id
LEFT JOIN runs sr ON sr.id = sg.run_id
LEFT JOIN attempt_tokens t ON t.attempt_id = a.replay_of
WHERE g.mode = 'replayed';
