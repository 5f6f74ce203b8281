-- Bulk insert of experiences with their version 1, in one statement (parallel arrays, `ords` 1..n).
-- Returns (ord, experience id, version id) in `ords` order.
WITH input AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('experiences', 'id')) AS id, t.*
    FROM unnest(
        CAST(:ords AS int[]), CAST(:problem_ids AS bigint[]), CAST(:source_attempt_ids AS bigint[]),
        CAST(:kinds AS text[]), CAST(:rewards AS float8[]), CAST(:run_ids AS bigint[]), CAST(:steps AS int[]),
        CAST(:summaries AS text[]), CAST(:authors AS text[]), CAST(:policy_version_ids AS bigint[]),
        CAST(:prompt_versions AS text[]), CAST(:embeddings AS text[])
    ) AS t(ord, problem_id, source_attempt_id, kind, reward, run_id, step, summary, author, policy_version_id,
           prompt_version, embedding)
),
experience AS (
    INSERT INTO experiences (id, problem_id, source_attempt_id, kind, reward, run_id, step)
    SELECT id, problem_id, source_attempt_id, kind, reward, run_id, step FROM input
),
version AS (
    INSERT INTO experience_versions (experience_id, version, summary, embedding, author, policy_version_id,
                                     prompt_version)
    SELECT id, 1, summary, CAST(embedding AS vector), author, policy_version_id, prompt_version FROM input
    RETURNING id, experience_id
)
SELECT input.ord, input.id AS experience_id, version.id AS version_id
FROM input JOIN version ON version.experience_id = input.id
ORDER BY input.ord
