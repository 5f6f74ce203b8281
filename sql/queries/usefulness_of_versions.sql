-- The lesson_usefulness rows of the given versions (a version never refreshed has none).
SELECT version_id, uses, helped, hurt, even, unknown, graded, credit, credit_var, net_credit, net_credit_var
FROM lesson_usefulness
WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
ORDER BY version_id
