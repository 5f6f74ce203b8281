-- What a cached BM25 index over a dataset's problems depends on: which rows, and their text
-- (problems can be re-imported with a new question, so the text is hashed too; a scan of one dataset).
SELECT count(*) AS n, coalesce(max(id), 0) AS max_id, coalesce(md5(string_agg(question, E'\x1f' ORDER BY id)), '') AS digest
FROM problems
WHERE dataset = :dataset
