-- Record (run, step) -> adapter sha256; returns the new row, or none when (run, step) is recorded already (the
-- caller then reads the stored one: policy_version_get). DO NOTHING, not a no-op DO UPDATE: it needs no UPDATE
-- privilege, so the serving role (migration 0014) can record its run's version without being able to change one.
INSERT INTO policy_versions (run_id, step, adapter_sha256) VALUES (:run_id, :step, :adapter_sha256)
ON CONFLICT (run_id, step) DO NOTHING
RETURNING id, adapter_sha256
