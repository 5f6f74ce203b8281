-- Bulk load of experiences with ids reserved by reserve_ids.sql (psycopg cursor.copy, binary rows).
COPY experiences (id, pool_id, problem_id, source_attempt_id, kind, reward, run_id, step) FROM STDIN (FORMAT BINARY)
