-- The active pools: every experience not evicted, with its pool and its current (latest) version.
CREATE OR REPLACE VIEW pool_current AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id, p.dataset, p.external_id, e.kind, e.reward,
       e.run_id, e.step, e.source_attempt_id, e.created_at, v.id AS version_id, v.version, v.summary, v.author
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN problems p ON p.id = e.problem_id
CROSS JOIN LATERAL (
    SELECT ev.id, ev.version, ev.summary, ev.author
    FROM experience_versions ev
    WHERE ev.experience_id = e.id
    ORDER BY ev.version DESC
    LIMIT 1
) v
WHERE e.evicted_at IS NULL;
