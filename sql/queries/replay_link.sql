-- Name each replayed attempt's source: attempts :attempt_ids (replayed copies just written) get replay_of from
-- :source_ids, pairwise (two arrays of one length).
UPDATE attempts a SET replay_of = l.source_id
FROM unnest(CAST(:attempt_ids AS bigint[]), CAST(:source_ids AS bigint[])) AS l(attempt_id, source_id)
WHERE a.id = l.attempt_id
