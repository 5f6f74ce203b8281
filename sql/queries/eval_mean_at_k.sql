-- mean@k per (mode, dataset) of one run, from its stored attempts: the final turn of each sample (an attempt
-- no group of the run uses as context) counts; mean over a problem's samples, then over problems. pass_at_k: the
-- share of problems with at least one correct sample. The two self-correction variants share the attempt mode
-- self_correct: a final turn written with :single_version (the single-turn reflection prompt) counts as
-- self_correct_single.
WITH final AS (
    SELECT CASE WHEN g.mode = 'self_correct' AND g.prompt_version = :single_version
                THEN 'self_correct_single' ELSE g.mode END AS mode,
           p.dataset, g.problem_id, coalesce(a.correct, false) AS correct
    FROM attempts AS a
    JOIN rollout_groups AS g ON g.id = a.group_id
    JOIN problems AS p ON p.id = g.problem_id
    WHERE g.run_id = :run_id
      AND NOT EXISTS (
          SELECT 1
          FROM group_contexts AS c
          JOIN rollout_groups AS later ON later.id = c.group_id
          WHERE c.context_attempt_id = a.id AND later.run_id = g.run_id
      )
),
per_problem AS (
    SELECT mode, dataset, problem_id, avg(correct::int::float8) AS accuracy, count(*) AS samples
    FROM final
    GROUP BY mode, dataset, problem_id
)
SELECT mode, dataset, avg(accuracy) AS mean_at_k, count(*) AS problems, sum(samples) AS samples,
       avg(CAST(accuracy > 0 AS int)) AS pass_at_k
FROM per_problem
GROUP BY mode, dataset
ORDER BY mode, dataset
