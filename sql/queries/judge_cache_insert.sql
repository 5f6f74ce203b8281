-- Store the judge's scores of one question text against lesson versions; a score already stored keeps its first value.
INSERT INTO judge_cache (question_sha256, scorer, version_id, score)
SELECT :question_sha256, :scorer, q.version_id, q.score
FROM unnest(CAST(:version_ids AS bigint[]), CAST(:scores AS float8[])) AS q(version_id, score)
ON CONFLICT (question_sha256, scorer, version_id) DO NOTHING
