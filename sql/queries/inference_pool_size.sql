-- How many experiences are in the active pool (not evicted): test-time retrieval falls back to zero-shot at 0.
SELECT count(*) AS n FROM experiences WHERE evicted_at IS NULL
