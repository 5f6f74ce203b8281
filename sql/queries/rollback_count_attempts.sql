-- Crash recovery: the attempts of the run's steps after :after_step (rollback_groups.sql deletes them with their
-- groups); counted for the resume's report.
SELECT count(*) FROM attempts a JOIN rollout_groups g ON g.id = a.group_id
WHERE g.run_id = :run_id AND g.step > :after_step
