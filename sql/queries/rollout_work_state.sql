-- Run :run_id's work by status, and the claims redone (taken again after a lease ran out) of step :step's.
SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'claimed' AND lease_until >= clock_timestamp()) AS claimed,
       count(*) FILTER (WHERE status = 'claimed' AND lease_until < clock_timestamp()) AS lapsed,
       count(*) FILTER (WHERE status = 'done') AS done,
       coalesce(sum(greatest(claims - 1, 0)) FILTER (WHERE step = :step), 0) AS redone
FROM rollout_work WHERE run_id = :run_id
