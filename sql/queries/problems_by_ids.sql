-- Problems by numeric id.
SELECT id, dataset, external_id, question, answer, metadata
FROM problems
WHERE id = ANY(CAST(:ids AS bigint[]))
