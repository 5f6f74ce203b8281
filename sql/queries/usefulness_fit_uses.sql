-- The graded uses of pool :pool_id's lesson versions (lesson_uses rows with a baseline and a graded attempt), one row
-- per version each use's context held (of any pool: a lesson beside one of the pool's is in its fit), for the joint
-- fit of their effects (lanpo.lesson_effects): m, the version's positions in the context; gain, the use's mean
-- correct - baseline over its graded attempts, and gain_var, its variance (var a + var b), both undone from the
-- share each item is credited (credit = m * n * gain / k, credit_var = (m * n / k)^2 * gain_var, graded = m * n,
-- k the context's items). By group, then version: the fit's input in one order, so a refit gives the same bits.
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
SELECT u.group_id, u.version_id, u.m, u.graded,
       u.credit * i.k / u.graded AS gain,
       u.credit_var * i.k * i.k / (CAST(u.graded AS double precision) * u.graded) AS gain_var
FROM items i
JOIN lesson_uses u ON u.group_id = i.group_id
WHERE u.graded > 0
ORDER BY u.group_id, u.version_id
