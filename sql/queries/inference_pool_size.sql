-- How many experiences of pool :pool_id are active (not evicted): test-time retrieval answers zero-shot at 0.
SELECT count(*) AS n FROM experiences WHERE pool_id = :pool_id AND evicted_at IS NULL
