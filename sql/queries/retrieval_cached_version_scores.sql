-- Cached problem-to-experience-version scores of one scorer for a list of (problem, version) pairs.
SELECT r.problem_id, r.candidate_version_id, r.score
FROM relevance_scores AS r
JOIN unnest(CAST(:problem_ids AS bigint[]), CAST(:candidate_ids AS bigint[])) AS q(problem_id, candidate_id)
    ON r.problem_id = q.problem_id AND r.candidate_version_id = q.candidate_id
WHERE r.scorer = :scorer
