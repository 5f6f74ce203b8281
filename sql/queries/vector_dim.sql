-- Declared dimension of a pgvector column (atttypmod), e.g. experience_versions.embedding.
SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = CAST(:table AS regclass) AND a.attname = :column
