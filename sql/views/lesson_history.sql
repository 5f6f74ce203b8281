-- Every version of every lesson (experience), evicted or not: what the lesson is (pool, source problem, kind), why
-- the version exists (reason: new | rewrite | merge:newer | merge:higher_reward; similarity: a merge's cosine to the
-- version it supersedes), its text, who wrote it (author, the policy version's step, the run and step whose
-- transaction wrote it), whether it is the lesson's current version, the lesson's state (active, or evicted_by /
-- evicted_at / evicted_run_id / evicted_step, and a person's evicted_note for 'manual:retired'), and the
-- version's usefulness from lesson_usefulness (0 uses where it has no row yet): its uses by outcome against the
-- zero-shot baseline (helped + hurt + even + unknown = uses), its graded attempts with a baseline and their summed
-- credit (each use's gain shared among its context's items: credit / graded is experience_usage.lift); credit_var,
-- the variance of credit; lift, the version's own effect on the chance of a correct answer as its pool's uses tell
-- it, the lessons drawn beside it integrated out (net_credit / graded; lanpo.lesson_effects, docs/concepts.md;
-- NULL with nothing graded), and lift's 95 % interval lift_low .. lift_high = lift -+ 1.96 * sqrt(net_credit_var) /
-- graded; and probation, the version's state read off that interval and the lesson's: 'retired' (the lesson was
-- retired by its record, evicted_by = 'retired:harmful', on every version's row), else 'untried' (graded = 0),
-- 'helps' (lift_low > 0), 'hurts' (lift_high < 0) or 'trying' (the interval spans 0). A lesson evicted for another
-- reason keeps its versions' evidence state. net_credit and net_credit_var come last (migration 0024).
CREATE OR REPLACE VIEW lesson_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id AS source_problem_id, e.kind,
       v.id AS version_id, v.version, v.reason, v.similarity, v.summary, v.author, v.policy_version_id,
       pv.step AS policy_step, v.run_id, v.step, v.source_attempt_id, v.reward, v.created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current,
       e.evicted_at IS NULL AS active, e.evicted_by, e.evicted_at, e.evicted_run_id, e.evicted_step, e.evicted_note,
       coalesce(u.uses, 0) AS uses, coalesce(u.helped, 0) AS helped, coalesce(u.hurt, 0) AS hurt,
       coalesce(u.even, 0) AS even, coalesce(u.unknown, 0) AS unknown, coalesce(u.graded, 0) AS graded,
       coalesce(u.credit, 0) AS credit, u.net_credit / CAST(nullif(u.graded, 0) AS double precision) AS lift,
       coalesce(u.credit_var, 0) AS credit_var,
       (u.net_credit - 1.96 * sqrt(u.net_credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_low,
       (u.net_credit + 1.96 * sqrt(u.net_credit_var)) / CAST(nullif(u.graded, 0) AS double precision) AS lift_high,
       CASE WHEN e.evicted_by = 'retired:harmful' THEN 'retired'
            WHEN coalesce(u.graded, 0) = 0 THEN 'untried'
            WHEN (u.net_credit - 1.96 * sqrt(u.net_credit_var)) / CAST(u.graded AS double precision) > 0 THEN 'helps'
            WHEN (u.net_credit + 1.96 * sqrt(u.net_credit_var)) / CAST(u.graded AS double precision) < 0 THEN 'hurts'
            ELSE 'trying' END AS probation,
       coalesce(u.net_credit, 0) AS net_credit, coalesce(u.net_credit_var, 0) AS net_credit_var
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN experience_versions v ON v.experience_id = e.id
LEFT JOIN policy_versions pv ON pv.id = v.policy_version_id
LEFT JOIN lesson_usefulness u ON u.version_id = v.id;
