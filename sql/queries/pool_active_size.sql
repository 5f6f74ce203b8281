-- Active (not evicted) experiences of one pool.
SELECT count(*) FROM experiences WHERE pool_id = :pool_id AND evicted_at IS NULL
