-- Problem ids of a dataset's external ids (inference attaches them to its questions).
SELECT id, external_id FROM problems WHERE dataset = :dataset AND external_id = ANY(CAST(:external_ids AS text[]))
