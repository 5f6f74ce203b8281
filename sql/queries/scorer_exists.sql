-- Whether relevance_scores holds any score by :scorer (stops at the first row found).
SELECT EXISTS (SELECT 1 FROM relevance_scores WHERE scorer = :scorer)
