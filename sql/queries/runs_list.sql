-- Every run (or those in :names, when not NULL), oldest first: what it is, its last committed step, and the age of
-- its last heartbeat in seconds by the database's clock (NULL: it never beat).
SELECT r.id, r.name, r.kind, r.status, r.model, r.owner,
       (SELECT max(s.step) FROM run_steps s WHERE s.run_id = r.id) AS last_step,
       r.started_at, r.finished_at,
       extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8 AS heartbeat_age_s
FROM runs r
WHERE CAST(:names AS text[]) IS NULL OR r.name = ANY(CAST(:names AS text[]))
ORDER BY r.id
