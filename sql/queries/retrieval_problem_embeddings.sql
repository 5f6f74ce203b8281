-- Every problem of a dataset with its embedding as text ('[x,y,...]', NULL when not embedded yet).
SELECT id, CAST(embedding AS text) AS embedding
FROM problems
WHERE dataset = :dataset
ORDER BY id
