-- Nearest current experience summaries of pool :pool_id by cosine distance: active experiences, latest version
-- only, never from the excluded problems (a problem never receives its own experiences as inter-sample feedback),
-- shared or of scope :scope (NULL: shared only; lanpo.serve.scopes).
SELECT v.id AS version_id, e.problem_id, 1 - (v.embedding <=> CAST(:query AS vector)) AS similarity, v.summary
FROM experience_versions AS v
JOIN experiences AS e ON e.id = v.experience_id
WHERE e.pool_id = :pool_id AND e.evicted_at IS NULL
  AND v.embedding IS NOT NULL
  AND e.problem_id <> ALL (CAST(:exclude_problem_ids AS bigint[]))
  AND (e.scope IS NULL OR e.scope = CAST(:scope AS text))
  AND NOT EXISTS (SELECT 1 FROM experience_versions AS w WHERE w.experience_id = v.experience_id AND w.version > v.version)
ORDER BY v.embedding <=> CAST(:query AS vector)
LIMIT :k
