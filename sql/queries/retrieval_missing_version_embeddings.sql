-- The next batch of experience versions without an embedding, for experiences of a dataset's problems
-- (dataset NULL = all); every version, current or evicted, is embedded once, in id order.
SELECT v.id, v.summary AS text
FROM experience_versions AS v
JOIN experiences AS e ON e.id = v.experience_id
JOIN problems AS p ON p.id = e.problem_id
WHERE v.embedding IS NULL
  AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)
  AND v.id > :after_id
ORDER BY v.id
LIMIT :limit
