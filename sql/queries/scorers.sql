-- Relevance scorers present in the store (named in error hints).
SELECT DISTINCT scorer FROM relevance_scores ORDER BY scorer
