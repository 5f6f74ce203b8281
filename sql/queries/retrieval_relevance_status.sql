-- Per scorer: how many problem-to-problem pairs of a dataset are scored, and how many reach gamma.
SELECT r.scorer, count(*) AS pairs, count(*) FILTER (WHERE r.score >= :gamma) AS at_gamma,
       avg(r.score) AS mean_score, count(DISTINCT r.problem_id) AS problems
FROM relevance_scores AS r
JOIN problems AS p ON p.id = r.problem_id
WHERE p.dataset = :dataset AND r.candidate_problem_id IS NOT NULL
GROUP BY r.scorer
ORDER BY r.scorer
