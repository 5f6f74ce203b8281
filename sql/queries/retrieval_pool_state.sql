-- What a cached BM25 index over pool :pool_id depends on. Versions are immutable and only appended, and an
-- experience leaves the pool by eviction or deletion, which lowers the active count: any change of the pool
-- changes (largest experience-version id in the store, active experiences of the pool). The first comes from
-- the primary key (a version appended to another pool also changes it: a spare rebuild, never a stale index),
-- the second from the active-pool index.
SELECT
    (SELECT coalesce(max(id), 0) FROM experience_versions) AS max_version_id,
    (SELECT count(*) FROM experiences WHERE pool_id = :pool_id AND evicted_at IS NULL) AS n_active
