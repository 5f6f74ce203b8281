-- Record (run, step) -> adapter sha256; returns the stored row (an existing one is kept as is).
INSERT INTO policy_versions (run_id, step, adapter_sha256) VALUES (:run_id, :step, :adapter_sha256)
ON CONFLICT (run_id, step) DO UPDATE SET adapter_sha256 = policy_versions.adapter_sha256
RETURNING id, adapter_sha256
