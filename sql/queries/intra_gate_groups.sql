-- The evidence of the intra gate (`feedback.intra.gate = "value"`, lanpo.feedback.intra_gate): the graded intra and
-- zero-shot rollout groups of one run at steps :lo <= step <= :hi whose problem could have been served intra there
-- (the run has a group of the problem at an earlier step, of a mode the intra draw reads: sample_intra.sql), each
-- with its graded attempts (n) and hits. Modes are drawn at random per problem (lanpo.feedback.schedule), so among
-- these problems the zero-shot groups are the intra groups' control share. A group's grade is attempts.correct,
-- else the attempt's latest answer_feedback verdict (as a lesson use's, usefulness_uses_recompute.sql).
SELECT g.mode, g.step, count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
FROM rollout_groups g
JOIN attempts a ON a.group_id = g.id
CROSS JOIN LATERAL (
    SELECT CAST(coalesce(a.correct, (
        SELECT f.correct FROM answer_feedback f
        WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
        ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
) x
WHERE g.run_id = :run_id AND g.step >= :lo AND g.step <= :hi AND g.mode IN ('intra', 'zero_shot')
  AND EXISTS (
      SELECT 1 FROM rollout_groups e
      WHERE e.run_id = g.run_id AND e.problem_id = g.problem_id AND e.step < g.step
        AND e.mode NOT IN ('val', 'replay', 'replayed', 'leaked_intra')
  )
GROUP BY g.id, g.mode, g.step
HAVING count(x.correct) > 0
ORDER BY g.step, g.id
