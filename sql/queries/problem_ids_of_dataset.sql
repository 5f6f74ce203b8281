-- Every problem id of a dataset, ascending.
SELECT id FROM problems WHERE dataset = :dataset ORDER BY id
