-- Existing problems of a dataset among the given external ids.
SELECT external_id, question, answer, metadata
FROM problems
WHERE dataset = :dataset AND external_id = ANY(CAST(:external_ids AS text[]))
