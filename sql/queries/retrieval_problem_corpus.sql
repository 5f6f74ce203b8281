-- The problems of one dataset as a BM25 corpus, in id order.
SELECT id, question
FROM problems
WHERE dataset = :dataset
ORDER BY id
