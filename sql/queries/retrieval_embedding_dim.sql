-- The declared dimension of a vector column (pgvector stores it as the type modifier).
SELECT a.atttypmod AS dim
FROM pg_attribute AS a
WHERE a.attrelid = CAST(:table_name AS regclass) AND a.attname = 'embedding' AND NOT a.attisdropped
