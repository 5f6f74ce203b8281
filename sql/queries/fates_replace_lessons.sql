-- The lessons run :run_id wrote from groups a re-issue replaces (their versions, relevance scores and usefulness rows
-- cascade): the re-issued group writes its own.
DELETE FROM experiences e
USING attempts a
WHERE e.source_attempt_id = a.id AND a.group_id = ANY(:group_ids) AND e.run_id = :run_id
