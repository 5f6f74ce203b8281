-- A trainer took groups off its buffer at :step: trained (:dropped NULL) or dropped with a reason. A group consumed
-- before keeps its first fate (a resumed run's rollback cleared the fates after its checkpoint).
UPDATE rollout_groups SET consumed_step = :step, dropped = :dropped
WHERE run_id = :run_id AND trainer_uid = ANY(:uids) AND consumed_step IS NULL
RETURNING trainer_uid
