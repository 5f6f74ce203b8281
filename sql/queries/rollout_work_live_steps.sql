-- The steps of run :run_id in [:first, :last] with a live attempt (queued, claimed, done or used): queued already.
SELECT DISTINCT step FROM rollout_work
WHERE run_id = :run_id AND step BETWEEN :first AND :last AND status <> 'dropped'
