-- Bulk load of attempts (the rollouts of groups) with ids reserved by reserve_ids.sql (binary rows).
COPY attempts (id, group_id, response, reward, correct, format_ok, completion_tokens, served_adapter_sha256)
FROM STDIN (FORMAT BINARY)
