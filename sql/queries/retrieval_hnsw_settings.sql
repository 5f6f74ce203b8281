-- Per-transaction HNSW search settings (SET LOCAL cannot take bind parameters; set_config(..., true) can).
-- iterative_scan lets a filtered HNSW scan keep going until LIMIT rows pass the WHERE clause (pgvector >= 0.8).
SELECT
    set_config('hnsw.ef_search', :ef_search, true),
    set_config('hnsw.iterative_scan', :iterative_scan, true),
    set_config('enable_indexscan', :enable_indexscan, true)
