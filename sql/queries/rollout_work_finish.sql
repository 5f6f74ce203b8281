-- The holder of claim :token marks its work done (no row back: the claim was lost, and its result is not kept).
UPDATE rollout_work SET status = 'done', finished_at = clock_timestamp(), lease_until = NULL
WHERE id = :id AND claim_token = CAST(:token AS uuid) AND status = 'claimed'
RETURNING id
