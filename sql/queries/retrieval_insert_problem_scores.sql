-- Store problem-to-problem scores; a pair already stored for this scorer keeps its first score.
INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score)
SELECT q.problem_id, q.candidate_id, :scorer, q.score
FROM unnest(CAST(:problem_ids AS bigint[]), CAST(:candidate_ids AS bigint[]), CAST(:scores AS float8[]))
    AS q(problem_id, candidate_id, score)
ON CONFLICT (problem_id, candidate_problem_id, scorer) WHERE candidate_problem_id IS NOT NULL DO NOTHING
