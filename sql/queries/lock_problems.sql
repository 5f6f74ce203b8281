-- Lock the given problems' rows in id order (writers that touch the same problems queue; no deadlocks).
-- FOR NO KEY UPDATE does not block foreign-key inserts (attempts) that take FOR KEY SHARE.
SELECT id FROM problems WHERE id = ANY(CAST(:problem_ids AS bigint[])) ORDER BY id FOR NO KEY UPDATE
