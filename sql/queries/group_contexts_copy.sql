-- Bulk load of what was injected into each group's prompt (psycopg cursor.copy, binary rows).
COPY group_contexts (group_id, position, experience_version_id, context_attempt_id, score) FROM STDIN (FORMAT BINARY)
