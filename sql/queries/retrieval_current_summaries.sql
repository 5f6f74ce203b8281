-- The current experience pool :pool_id as a corpus: the latest version of every experience not evicted.
SELECT DISTINCT ON (v.experience_id) v.id AS version_id, e.problem_id, v.summary
FROM experiences AS e
JOIN experience_versions AS v ON v.experience_id = e.id
WHERE e.pool_id = :pool_id AND e.evicted_at IS NULL
ORDER BY v.experience_id, v.version DESC
