-- The judge's cached scores of one question text (by its sha256) against lesson versions, by one scorer.
SELECT c.version_id, c.score
FROM judge_cache AS c
WHERE c.question_sha256 = :question_sha256 AND c.scorer = :scorer AND c.version_id = ANY(CAST(:version_ids AS bigint[]))
