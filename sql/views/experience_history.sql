-- Every version of every experience, evicted or not, with its pool, its eviction record and whether it is current.
CREATE OR REPLACE VIEW experience_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id, p.dataset, p.external_id, e.kind, e.reward,
       e.run_id, e.step, e.source_attempt_id, e.created_at AS experience_created_at, e.evicted_at, e.evicted_by,
       e.evicted_at IS NULL AS active, v.id AS version_id, v.version, v.summary, v.author, v.policy_version_id,
       v.prompt_version, v.created_at AS version_created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN problems p ON p.id = e.problem_id
JOIN experience_versions v ON v.experience_id = e.id;
