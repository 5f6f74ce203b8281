-- The current experience pool :pool_id as a corpus: the latest version of every experience not evicted, with the
-- scope of a lesson `lanpo serve` learned (NULL: shared; the search keeps a request's own scope and the shared).
SELECT DISTINCT ON (v.experience_id) v.id AS version_id, e.problem_id, v.summary, e.scope
FROM experiences AS e
JOIN experience_versions AS v ON v.experience_id = e.id
WHERE e.pool_id = :pool_id AND e.evicted_at IS NULL
ORDER BY v.experience_id, v.version DESC
