-- Bulk insert of attempts and the contexts injected into their prompts, in one statement.
-- Attempt arrays are parallel (one element per attempt, `ords` 1..n); context arrays are parallel
-- (one element per context, `ctx_ords` naming the attempt). Returns the new attempt ids in `ords` order.
WITH a AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('attempts', 'id')) AS id, t.*
    FROM unnest(
        CAST(:ords AS int[]), CAST(:run_ids AS bigint[]), CAST(:problem_ids AS bigint[]), CAST(:steps AS int[]),
        CAST(:policy_version_ids AS bigint[]), CAST(:modes AS text[]), CAST(:prompts AS text[]),
        CAST(:responses AS text[]), CAST(:prompt_versions AS text[]), CAST(:rewards AS float8[]),
        CAST(:corrects AS bool[]), CAST(:format_oks AS bool[]), CAST(:prompt_tokens AS int[]),
        CAST(:completion_tokens AS int[])
    ) AS t(ord, run_id, problem_id, step, policy_version_id, mode, prompt, response, prompt_version, reward,
           correct, format_ok, prompt_tokens, completion_tokens)
),
inserted AS (
    INSERT INTO attempts (id, run_id, problem_id, step, policy_version_id, mode, prompt, response, prompt_version,
                          reward, correct, format_ok, prompt_tokens, completion_tokens)
    SELECT id, run_id, problem_id, step, policy_version_id, mode, prompt, response, prompt_version,
           reward, correct, format_ok, prompt_tokens, completion_tokens
    FROM a
),
contexts AS (
    INSERT INTO attempt_contexts (attempt_id, position, experience_version_id, context_attempt_id, score)
    SELECT a.id, c.position, c.experience_version_id, c.context_attempt_id, c.score
    FROM unnest(
        CAST(:ctx_ords AS int[]), CAST(:ctx_positions AS int[]), CAST(:ctx_version_ids AS bigint[]),
        CAST(:ctx_attempt_ids AS bigint[]), CAST(:ctx_scores AS float8[])
    ) AS c(ord, position, experience_version_id, context_attempt_id, score)
    JOIN a ON a.ord = c.ord
)
SELECT id FROM a ORDER BY ord
