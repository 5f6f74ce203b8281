-- One row per contrastive pair MEL diagnosed: its attempts, the bifurcation step (1-based, in the negative's
-- steps) and the shared prefix, the diagnosis, the lesson it gave (the version its replays carried), the replays
-- and their successes, the verdict, whether the lesson is in the pool, and the steps whose NLL term trained it.
-- Pairs whose diagnosis gave no lesson have no experience, replays nor verdict.
CREATE OR REPLACE VIEW meta_experience_history AS
SELECT mp.id AS pair_id, mp.run_id, r.name AS run_name, mp.step, mp.problem_id, p.dataset, p.external_id,
       mp.positive_attempt_id, mp.negative_attempt_id, mp.step_split, mp.bifurcation_step, mp.shared_prefix_steps,
       mp.located_by, mp.diagnosis, mp.group_success_rate, mp.experience_id, rv.version_id, rv.meta_experience,
       mp.replay_group_id, rv.replays, rv.replay_successes, mp.replay_success_rate, mp.validation_rule, mp.verdict,
       e.id IS NOT NULL AND e.evicted_at IS NULL AS active, e.evicted_by, nll.nll_steps, nll.nll_tokens,
       mp.created_at
FROM meta_pairs mp
JOIN runs r ON r.id = mp.run_id
JOIN problems p ON p.id = mp.problem_id
LEFT JOIN experiences e ON e.id = mp.experience_id
LEFT JOIN LATERAL (
    SELECT gc.experience_version_id AS version_id, v.summary AS meta_experience,
           (SELECT count(*) FROM attempts a WHERE a.group_id = mp.replay_group_id) AS replays,
           (SELECT count(*) FROM attempts a WHERE a.group_id = mp.replay_group_id AND a.correct) AS replay_successes
    FROM group_contexts gc
    JOIN experience_versions v ON v.id = gc.experience_version_id
    WHERE gc.group_id = mp.replay_group_id
    ORDER BY gc.position
    LIMIT 1
) rv ON true
LEFT JOIN LATERAL (
    SELECT array_agg(u.step ORDER BY u.step) AS nll_steps, sum(u.tokens) AS nll_tokens
    FROM meta_nll_uses u
    WHERE u.experience_id = mp.experience_id
) nll ON true;
