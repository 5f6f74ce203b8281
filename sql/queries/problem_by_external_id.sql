-- One problem by dataset + external id.
SELECT id, dataset, external_id, question, answer, metadata
FROM problems
WHERE dataset = :dataset AND external_id = :external_id
