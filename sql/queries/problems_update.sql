-- Overwrite question/answer/metadata of existing problems (by dataset + external id).
UPDATE problems p
SET question = t.question, answer = t.answer, metadata = CAST(t.metadata AS jsonb)
FROM unnest(
    CAST(:external_ids AS text[]), CAST(:questions AS text[]), CAST(:answers AS text[]), CAST(:metadatas AS text[])
) AS t(external_id, question, answer, metadata)
WHERE p.dataset = :dataset AND p.external_id = t.external_id
