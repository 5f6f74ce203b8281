-- Counts for `lanpo pool stats`: problems, active / evicted experiences, attempts (optionally one :dataset).
SELECT
    (SELECT count(*) FROM problems p WHERE CAST(:dataset AS text) IS NULL OR p.dataset = :dataset) AS problems,
    (SELECT count(*) FROM experiences e JOIN problems p ON p.id = e.problem_id
     WHERE e.evicted_at IS NULL AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)) AS active,
    (SELECT count(*) FROM experiences e JOIN problems p ON p.id = e.problem_id
     WHERE e.evicted_at IS NOT NULL AND (CAST(:dataset AS text) IS NULL OR p.dataset = :dataset)) AS evicted,
    (SELECT count(*) FROM attempts a JOIN problems p ON p.id = a.problem_id
     WHERE CAST(:dataset AS text) IS NULL OR p.dataset = :dataset) AS attempts
