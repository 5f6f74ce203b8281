-- The holder of claim :token keeps its lease; no row back: the claim was lost (its lease ran out and another
-- worker took it, or the trainer dropped it).
UPDATE rollout_work SET lease_until = clock_timestamp() + make_interval(secs => :lease_s)
WHERE id = :id AND claim_token = CAST(:token AS uuid) AND status = 'claimed'
RETURNING id
