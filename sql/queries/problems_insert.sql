-- Bulk insert of new problems (arrays of equal length); returns nothing.
INSERT INTO problems (dataset, external_id, question, answer, metadata)
SELECT :dataset, t.external_id, t.question, t.answer, CAST(t.metadata AS jsonb)
FROM unnest(
    CAST(:external_ids AS text[]), CAST(:questions AS text[]), CAST(:answers AS text[]), CAST(:metadatas AS text[])
) AS t(external_id, question, answer, metadata)
