-- Cached problem-to-problem scores of one scorer for a list of (problem, candidate problem) pairs.
SELECT r.problem_id, r.candidate_problem_id, r.score
FROM relevance_scores AS r
JOIN unnest(CAST(:problem_ids AS bigint[]), CAST(:candidate_ids AS bigint[])) AS q(problem_id, candidate_id)
    ON r.problem_id = q.problem_id AND r.candidate_problem_id = q.candidate_id
WHERE r.scorer = :scorer
