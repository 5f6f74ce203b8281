-- Work :id's claim ends without a result (its worker could not serve it, or was stopped): open again at once.
UPDATE rollout_work SET status = 'queued', lease_until = NULL, claim_token = NULL, claimed_by = NULL
WHERE id = :id AND claim_token = CAST(:token AS uuid) AND status = 'claimed'
RETURNING id
