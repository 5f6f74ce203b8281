-- Bulk load of attempts' completion token ids and their behaviour log-probs (engine | trainer), one row per attempt
-- (binary rows).
COPY attempt_tokens (attempt_id, token_ids, logprobs, logprobs_of)
FROM STDIN (FORMAT BINARY)
