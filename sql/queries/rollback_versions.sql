-- Crash recovery: the versions steps after the last committed one appended to older lessons (a merge; a lesson of
-- those steps goes whole with rollback_experiences). Their contexts went with the steps' groups, their relevance
-- scores and usefulness rows cascade.
DELETE FROM experience_versions WHERE run_id = :run_id AND step > :after_step AND version > 1
