-- Bulk load of experience versions (embedding as pgvector text '[a,b,...]' or NULL; psycopg cursor.copy, text rows).
COPY experience_versions (id, experience_id, version, summary, embedding, author, policy_version_id, prompt_version)
FROM STDIN
