-- Lock the given versions' lesson_usefulness rows in version order (refreshers of the same versions queue until
-- the holder commits; one order, so no deadlock).
SELECT version_id FROM lesson_usefulness
WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
ORDER BY version_id
FOR UPDATE
