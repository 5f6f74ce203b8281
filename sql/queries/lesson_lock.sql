-- Lock one lesson (experience) for a change of its state, and read its pool and eviction record (lanpo pool retire).
SELECT e.id, e.pool_id, pl.name AS pool, e.evicted_at, e.evicted_by, e.evicted_note
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
WHERE e.id = :experience_id
FOR NO KEY UPDATE OF e
