-- How many experience versions still lack an embedding (dataset NULL = every dataset).
SELECT count(*)
FROM experience_versions AS v
JOIN experiences AS e ON e.id = v.experience_id
JOIN problems AS p ON p.id = e.problem_id
WHERE v.embedding IS NULL AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)
