-- One request `lanpo serve` answered; a second row with the same request_id is refused (UNIQUE): a request is never
-- stored twice. :scope: the scope the request named (NULL: none; migration 0022).
INSERT INTO served_answers (request_id, run_id, group_id, answer_ids, mode, fallback, sampling, timings, key_name,
                            streamed, scope)
VALUES (:request_id, :run_id, :group_id, CAST(:answer_ids AS bigint[]), :mode, :fallback, CAST(:sampling AS jsonb),
        CAST(:timings AS jsonb), :key_name, :streamed, :scope)
RETURNING id
