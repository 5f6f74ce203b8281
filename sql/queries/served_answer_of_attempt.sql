-- The served answer that holds attempt :attempt_id (the GIN index on answer_ids finds it), with what feedback needs:
-- the attempt's response, its problem's question, the run and the pool it read, the request's scope. No row: not a
-- served answer.
SELECT a.id AS attempt_id, a.response, p.id AS problem_id, p.question, s.id AS served_id, s.request_id, s.run_id,
       r.pool_id, pl.name AS pool_name, s.mode, s.scope
FROM served_answers s
JOIN attempts a ON a.id = :attempt_id
JOIN rollout_groups g ON g.id = a.group_id
JOIN problems p ON p.id = g.problem_id
JOIN runs r ON r.id = s.run_id
LEFT JOIN pools pl ON pl.id = r.pool_id
WHERE s.answer_ids @> ARRAY[CAST(:attempt_id AS bigint)]
ORDER BY s.id
LIMIT 1
