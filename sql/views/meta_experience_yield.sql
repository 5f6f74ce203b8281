-- Validation yield per committed step of each MEL run (runs.config method = 'mel'): groups with both correct and
-- incorrect rollouts -> pairs diagnosed -> candidates (a usable lesson) -> validated / rejected by replay, the mean
-- replay success rate, and the lessons the NLL term trained on.
CREATE OR REPLACE VIEW meta_experience_yield AS
WITH mel_steps AS (
    SELECT s.run_id, r.name AS run_name, s.step
    FROM run_steps s
    JOIN runs r ON r.id = s.run_id
    WHERE s.step >= 1 AND r.config ->> 'method' = 'mel'
),
mixed AS (
    SELECT m.run_id, m.step, count(*) AS qualifying_groups
    FROM (
        SELECT g.run_id, g.step
        FROM rollout_groups g
        JOIN attempts a ON a.group_id = g.id
        WHERE g.mode IN ('zero_shot', 'intra', 'inter')
        GROUP BY g.id, g.run_id, g.step
        HAVING bool_or(a.correct) AND bool_or(NOT a.correct)
    ) m
    GROUP BY m.run_id, m.step
),
pairs AS (
    SELECT run_id, step, count(*) AS pairs, count(experience_id) AS candidates,
           count(*) FILTER (WHERE verdict = 'validated') AS validated,
           count(*) FILTER (WHERE verdict = 'rejected') AS rejected,
           avg(replay_success_rate) AS replay_success_rate
    FROM meta_pairs
    GROUP BY run_id, step
),
uses AS (
    SELECT run_id, step, count(*) AS nll_examples, sum(tokens) AS nll_tokens
    FROM meta_nll_uses
    GROUP BY run_id, step
)
SELECT s.run_id, s.run_name, s.step, coalesce(m.qualifying_groups, 0) AS qualifying_groups,
       coalesce(p.pairs, 0) AS pairs, coalesce(p.candidates, 0) AS candidates,
       coalesce(p.validated, 0) AS validated, coalesce(p.rejected, 0) AS rejected,
       CAST(p.validated AS float8) / nullif(p.pairs, 0) AS validation_yield, p.replay_success_rate,
       coalesce(u.nll_examples, 0) AS nll_examples, coalesce(u.nll_tokens, 0) AS nll_tokens
FROM mel_steps s
LEFT JOIN mixed m ON m.run_id = s.run_id AND m.step = s.step
LEFT JOIN pairs p ON p.run_id = s.run_id AND p.step = s.step
LEFT JOIN uses u ON u.run_id = s.run_id AND u.step = s.step;
