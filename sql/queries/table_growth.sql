-- Size now against size at the last ANALYZE, per table of :tables (text[], names in the search path): what
-- lanpo.db.stats reads after a bulk write to decide which tables to analyze. relpages and reltuples are what
-- ANALYZE (or VACUUM) last set; reltuples is -1 until the table is first analyzed (PostgreSQL 14+).
SELECT c.relname AS name, c.relpages, c.reltuples,
       pg_relation_size(c.oid) / CAST(current_setting('block_size') AS int) AS pages
FROM unnest(CAST(:tables AS text[])) AS t(name)
JOIN pg_class c ON c.oid = to_regclass(t.name)
ORDER BY c.relname
