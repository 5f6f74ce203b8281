-- The lesson already learned from served attempt :attempt_id (one per answer: a second good feedback adds none),
-- active or not; no row: none yet.
SELECT id FROM experiences
WHERE source_attempt_id = :attempt_id AND feedback_id IS NOT NULL
ORDER BY id
LIMIT 1
