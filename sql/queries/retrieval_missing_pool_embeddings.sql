-- The current experience versions of one pool that have no embedding yet (a trainer writes lessons without one):
-- test-time vector search embeds them before it searches, so no lesson is invisible to it.
SELECT v.id, v.summary AS text
FROM experience_versions AS v
JOIN experiences AS e ON e.id = v.experience_id
WHERE e.pool_id = :pool_id
  AND e.evicted_at IS NULL
  AND v.embedding IS NULL
ORDER BY v.id
LIMIT :limit
