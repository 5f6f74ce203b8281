-- The graded uses of pool :pool_id's lesson versions (lesson_uses rows with a baseline and a graded attempt), one row
-- per version each use's context held (of any pool: a lesson beside one of the pool's is in its fit), for the joint
-- fit of their effects (lanpo.lesson_effects): m, the version's positions in the context; gain, the use's mean
-- correct - baseline over its graded attempts, and gain_var, its variance (var a + var b), both undone from the
-- share each item is credited (credit = m * n * gain / k, credit_var = (m * n / k)^2 * gain_var, graded = m * n,
-- k the context's items). By group, then version: the fit's input in one order, so a refit gives the same bits.
-- One row of six arrays (a column each, in that order; NULLs without uses): a pool's uses are read as arrays, not
-- as a row apiece.
WITH used AS (
    SELECT DISTINCT u.group_id
    FROM experiences e
    JOIN experience_versions v ON v.experience_id = e.id
    JOIN lesson_uses u ON u.version_id = v.id
    WHERE e.pool_id = :pool_id AND u.graded > 0
),
items AS (
    SELECT gc.group_id, count(*) AS k
    FROM used
    JOIN group_contexts gc ON gc.group_id = used.group_id
    WHERE gc.experience_version_id IS NOT NULL
    GROUP BY gc.group_id
)
SELECT array_agg(u.group_id ORDER BY u.group_id, u.version_id) AS group_ids,
       array_agg(u.version_id ORDER BY u.group_id, u.version_id) AS version_ids,
       array_agg(u.m ORDER BY u.group_id, u.version_id) AS m,
       array_agg(u.graded ORDER BY u.group_id, u.version_id) AS graded,
       array_agg(u.credit * i.k / u.graded ORDER BY u.group_id, u.version_id) AS gain,
       array_agg(u.credit_var * i.k * i.k / (CAST(u.graded AS double precision) * u.graded)
                 ORDER BY u.group_id, u.version_id) AS gain_var
FROM items i
JOIN lesson_uses u ON u.group_id = i.group_id
WHERE u.graded > 0
