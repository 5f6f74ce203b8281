-- Reserve :n ids of :table's identity sequence (for rows then written with COPY); concurrency-safe.
-- The sequence is resolved once (MATERIALIZED), not per row, and the ids come back as one array.
WITH s AS MATERIALIZED (
    SELECT CAST(pg_get_serial_sequence(:table, 'id') AS regclass) AS seq
)
SELECT array_agg(nextval(s.seq)) FROM s, generate_series(1, :n)
