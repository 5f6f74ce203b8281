-- Reserve :n ids of :table's identity sequence (for rows then written with COPY); concurrency-safe.
SELECT nextval(pg_get_serial_sequence(:table, 'id')) FROM generate_series(1, :n)
