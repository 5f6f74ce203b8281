-- A worker takes the oldest open work of run :run_id: queued, or claimed under a lease that ran out (its worker
-- stopped renewing it: the claim is redone). SKIP LOCKED: two workers claiming at once never take the same row.
-- Each take draws a new claim_token; only its holder may renew or finish the row.
UPDATE rollout_work w
SET status = 'claimed', claimed_by = :worker, claim_token = gen_random_uuid(), claimed_at = clock_timestamp(),
    lease_until = clock_timestamp() + make_interval(secs => :lease_s), claims = w.claims + 1
WHERE w.id = (
    SELECT o.id FROM rollout_work o
    WHERE o.run_id = :run_id
      AND (o.status = 'queued' OR (o.status = 'claimed' AND o.lease_until < clock_timestamp()))
    ORDER BY o.step, o.attempt
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING w.id, w.step, w.attempt, w.prompts, w.min_policy_step, w.claim_token::text AS claim_token, w.claims
