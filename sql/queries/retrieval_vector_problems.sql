-- Nearest problems of a dataset by cosine distance (HNSW index scan unless index scans are disabled).
SELECT id, 1 - (embedding <=> CAST(:query AS vector)) AS similarity
FROM problems
WHERE dataset = :dataset
  AND embedding IS NOT NULL
  AND id <> ALL (CAST(:exclude_ids AS bigint[]))
ORDER BY embedding <=> CAST(:query AS vector)
LIMIT :k
