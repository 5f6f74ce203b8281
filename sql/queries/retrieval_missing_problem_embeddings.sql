-- The next batch of problems without an embedding (keyset pagination on id; dataset NULL = every dataset).
SELECT id, question AS text
FROM problems
WHERE embedding IS NULL
  AND (CAST(:dataset AS text) IS NULL OR dataset = :dataset)
  AND id > :after_id
ORDER BY id
LIMIT :limit
