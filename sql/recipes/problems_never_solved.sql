-- Problems never solved: attempted at least once, never with correct = true.
SELECT p.id, p.dataset, p.external_id, count(a.id) AS attempts, max(a.reward) AS best_reward,
       left(p.question, 80) AS question
FROM problems p
JOIN rollout_groups g ON g.problem_id = p.id
JOIN attempts a ON a.group_id = g.id
GROUP BY p.id
HAVING NOT coalesce(bool_or(a.correct), false)
ORDER BY attempts DESC, p.id
LIMIT 100;
