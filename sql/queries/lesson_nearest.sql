-- The active lessons of problem :problem_id and kind :kind in pool :pool_id nearest to :embedding by cosine, through
-- their current versions, closest first (ties: the older lesson), at most :limit: the candidates a new lesson may
-- merge into (lanpo.db.repo.merge). A lesson whose current version has no embedding yet is not a candidate; the
-- writer embeds the pool's missing ones first. Exact: a problem holds at most per_problem_cap active lessons.
SELECT e.id AS experience_id, v.id AS version_id, v.summary, v.reward,
       1 - (v.embedding <=> CAST(:embedding AS vector)) AS similarity
FROM experiences e
CROSS JOIN LATERAL (
    SELECT ev.id, ev.summary, ev.reward, ev.embedding FROM experience_versions ev
    WHERE ev.experience_id = e.id
    ORDER BY ev.version DESC
    LIMIT 1
) v
WHERE e.pool_id = :pool_id AND e.problem_id = :problem_id AND e.kind = :kind AND e.evicted_at IS NULL
  AND v.embedding IS NOT NULL
ORDER BY v.embedding <=> CAST(:embedding AS vector), e.id
LIMIT :limit
