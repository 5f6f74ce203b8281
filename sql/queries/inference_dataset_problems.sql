-- The problems of a dataset in id order, the first :limit of them (NULL: all), as evaluation questions.
SELECT id, external_id, question, answer, metadata
FROM problems
WHERE dataset = :dataset
ORDER BY id
LIMIT CAST(:limit AS bigint)
