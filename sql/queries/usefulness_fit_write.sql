-- Write the joint fit of pool :pool_id (usefulness.fit_pools): each of its versions' lesson_usefulness row takes
-- net_credit and net_credit_var from the arrays (:version_ids, :net_credits, :net_credit_vars, one length), 0 and
-- 0 where the fit has none (no graded use). Versions of other pools in the arrays are left alone (their pool's own
-- fit writes them); a row that would not change is left alone.
WITH fit AS (
    SELECT * FROM unnest(CAST(:version_ids AS bigint[]), CAST(:net_credits AS double precision[]),
                         CAST(:net_credit_vars AS double precision[])) AS f(version_id, net_credit, net_credit_var)
),
target AS (
    SELECT lu.version_id, coalesce(f.net_credit, 0) AS net_credit, coalesce(f.net_credit_var, 0) AS net_credit_var
    FROM experiences e
    JOIN experience_versions v ON v.experience_id = e.id
    JOIN lesson_usefulness lu ON lu.version_id = v.id
    LEFT JOIN fit f ON f.version_id = lu.version_id
    WHERE e.pool_id = :pool_id
)
UPDATE lesson_usefulness lu
SET net_credit = t.net_credit, net_credit_var = t.net_credit_var
FROM target t
WHERE lu.version_id = t.version_id
  AND (lu.net_credit, lu.net_credit_var) IS DISTINCT FROM (t.net_credit, t.net_credit_var)
