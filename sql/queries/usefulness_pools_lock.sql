-- Lock the pools of the given lesson versions, one advisory lock per pool taken in pool order and held to the end
-- of the transaction (usefulness.refresh, before it locks the versions' rows): the fit of a pool's uses
-- (usefulness_fit_uses.sql, usefulness_fit_write.sql) rewrites every version of the pool, so its writers take turns,
-- and each reads the uses the one before it committed. The same order everywhere, pools before rows: no deadlock.
-- Returns the pools.
SELECT p.pool_id, pg_advisory_xact_lock(hashtext('lanpo:lesson_fit'), CAST(p.pool_id % 2147483647 AS integer))
FROM (
    SELECT DISTINCT e.pool_id
    FROM experience_versions v
    JOIN experiences e ON e.id = v.experience_id
    WHERE v.id = ANY(CAST(:version_ids AS bigint[]))
) p
ORDER BY p.pool_id
