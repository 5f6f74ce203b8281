-- Bulk load of what was injected into each attempt's prompt (psycopg cursor.copy, binary rows).
COPY attempt_contexts (attempt_id, position, experience_version_id, context_attempt_id, score) FROM STDIN (FORMAT BINARY)
