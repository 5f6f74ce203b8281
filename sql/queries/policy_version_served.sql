-- Tie the weights a rollout engine served (LoRA merged into the base) to a policy version; a version already tied
-- keeps what it has, and a version's own hash ties nothing. Returns the stored tie (no row: its own hash).
UPDATE policy_versions SET served_sha256 = coalesce(served_sha256, :served)
WHERE id = :id AND adapter_sha256 <> :served
RETURNING served_sha256
