-- Bulk load of attempts with ids reserved by reserve_ids.sql (psycopg cursor.copy, binary rows).
COPY attempts (id, run_id, problem_id, step, policy_version_id, mode, prompt, response, prompt_version, reward,
               correct, format_ok, prompt_tokens, completion_tokens) FROM STDIN (FORMAT BINARY)
