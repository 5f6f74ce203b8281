-- One advisory lock per pool, held to the end of the transaction, serialises writers that enforce its global cap.
SELECT pg_advisory_xact_lock(hashtext('lanpo:global_cap'), CAST(:pool_id % 2147483647 AS integer))
