-- How many problems still lack an embedding (dataset NULL = every dataset).
SELECT count(*) FROM problems
WHERE embedding IS NULL AND (CAST(:dataset AS text) IS NULL OR dataset = :dataset)
