-- What a cached BM25 index over the current pool depends on. Versions are immutable and only appended, and an
-- experience leaves the pool by eviction or deletion, which lowers the active count: any change of the pool
-- changes (max version id, active experiences). Both come from indexes (primary key; the active-pool partial index).
SELECT
    (SELECT coalesce(max(id), 0) FROM experience_versions) AS max_version_id,
    (SELECT count(*) FROM experiences WHERE evicted_at IS NULL) AS n_active
