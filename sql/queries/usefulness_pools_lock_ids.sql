-- Lock pools :pool_ids for their fit (usefulness.refit_after): the advisory lock of usefulness_pools_lock.sql, one
-- per pool, in pool order, held to the end of the transaction.
SELECT p.pool_id, pg_advisory_xact_lock(hashtext('lanpo:lesson_fit'), CAST(p.pool_id % 2147483647 AS integer))
FROM (SELECT DISTINCT unnest(CAST(:pool_ids AS bigint[])) AS pool_id) p
ORDER BY p.pool_id
