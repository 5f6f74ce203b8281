-- Every problem of a dataset, in id order.
SELECT id, dataset, external_id, question, answer, metadata FROM problems WHERE dataset = :dataset ORDER BY id
