-- Validation recounted from the stored `val` attempts of the runs :run_ids, per (run, step, dataset):
-- mean@k = mean over problems of the share of a problem's samples that are correct; pass@k = share of problems
-- with at least one correct sample; boxed = share of samples with format_ok (a val attempt's: it has a \boxed{}
-- answer); k = most samples of one problem; mean_at_k_se = the standard error of mean@k over the problems (their
-- shares' sample std / sqrt(problems); NULL for one problem); samples = every sample (the matched-budget table's n).
-- An ungraded sample (correct NULL) counts as wrong, as in eval_mean_at_k.
WITH per_problem AS (
    SELECT g.run_id, g.step, p.dataset, g.problem_id,
           avg(CAST(coalesce(a.correct, false) AS integer)) AS share_correct,
           bool_or(coalesce(a.correct, false)) AS solved,
           sum(CAST(coalesce(a.format_ok, false) AS integer)) AS formatted,
           count(*) AS samples
    FROM attempts AS a
    JOIN rollout_groups AS g ON g.id = a.group_id
    JOIN problems AS p ON p.id = g.problem_id
    WHERE g.mode = 'val' AND g.step IS NOT NULL AND g.run_id = ANY(CAST(:run_ids AS bigint[]))
    GROUP BY g.run_id, g.step, p.dataset, g.problem_id
)
SELECT run_id, step, dataset,
       avg(share_correct) AS mean_at_k,
       CAST(stddev_samp(share_correct) AS float8) / sqrt(count(*)) AS mean_at_k_se,
       avg(CAST(solved AS integer)) AS pass_at_k,
       CAST(sum(formatted) AS float8) / sum(samples) AS boxed_rate,
       max(samples) AS k,
       sum(samples) AS samples,
       count(*) AS problems
FROM per_problem
GROUP BY run_id, step, dataset
ORDER BY run_id, dataset, step
