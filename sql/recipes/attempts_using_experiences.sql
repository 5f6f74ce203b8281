-- Attempts that used an experience: each inter attempt with the versions injected into its prompt (latest
-- first). Add `WHERE c.experience_version_id = <id>` to follow one experience.
SELECT a.id AS attempt_id, a.run_id, a.step, a.problem_id, c.position, c.experience_version_id,
       v.experience_id, round(CAST(c.score AS numeric), 3) AS relevance, a.reward, a.correct
FROM attempt_contexts c
JOIN attempts a ON a.id = c.attempt_id
JOIN experience_versions v ON v.id = c.experience_version_id
ORDER BY a.id DESC, c.position
LIMIT 100;
