-- What a cached BM25 index over the current pool depends on. Versions are immutable and only appended,
-- experiences only leave the pool by eviction or deletion, so these four numbers change whenever the pool does.
SELECT
    (SELECT coalesce(max(id), 0) FROM experience_versions) AS max_version_id,
    (SELECT count(*) FROM experience_versions) AS n_versions,
    (SELECT count(*) FROM experiences) AS n_experiences,
    (SELECT count(*) FROM experiences WHERE evicted_at IS NOT NULL) AS n_evicted
