-- The stored policy version of (run, step), with its adapter.
SELECT id, adapter_sha256 FROM policy_versions WHERE run_id = :run_id AND step = :step
