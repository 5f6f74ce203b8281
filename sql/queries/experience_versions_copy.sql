-- Bulk load of experience versions (embedding as pgvector text '[a,b,...]' or NULL; psycopg cursor.copy, text rows).
-- The provenance columns name the rollout the text came from, its reward and the run's step that wrote it.
COPY experience_versions (id, experience_id, version, summary, embedding, author, policy_version_id, prompt_version,
                          source_attempt_id, reward, run_id, step)
FROM STDIN
