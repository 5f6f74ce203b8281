-- A model other than :model whose runs wrote lessons into pool :pool (NULL: none did).
SELECT r.model
FROM experiences e
JOIN runs r ON r.id = e.run_id
JOIN pools p ON p.id = e.pool_id
WHERE p.name = :pool AND r.model IS DISTINCT FROM :model
LIMIT 1
