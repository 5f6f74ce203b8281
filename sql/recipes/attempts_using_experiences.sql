-- Attempts that used an experience: each attempt whose prompt carried experience versions, with them (latest
-- first). Add `WHERE c.experience_version_id = <id>` to follow one experience.
SELECT a.id AS attempt_id, g.run_id, g.step, g.problem_id, c.position, c.experience_version_id,
       v.experience_id, round(CAST(c.score AS numeric), 3) AS relevance, a.reward, a.correct
FROM group_contexts c
JOIN rollout_groups g ON g.id = c.group_id
JOIN attempts a ON a.group_id = g.id
JOIN experience_versions v ON v.id = c.experience_version_id
ORDER BY a.id DESC, c.position
LIMIT 100;
