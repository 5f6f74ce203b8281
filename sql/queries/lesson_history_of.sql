-- One lesson's chain, oldest version first, from the lesson_history view (lanpo pool history): every column it has.
SELECT experience_id, pool_id, pool, source_problem_id, kind, version_id, version, reason, similarity, summary,
       author, policy_version_id, policy_step, run_id, step, source_attempt_id, reward, created_at, is_current, active,
       evicted_by, evicted_at, evicted_run_id, evicted_step, evicted_note, uses, helped, hurt, even, unknown, graded,
       credit, lift, credit_var, lift_low, lift_high, probation, net_credit, net_credit_var
FROM lesson_history
WHERE experience_id = :experience_id
ORDER BY version
