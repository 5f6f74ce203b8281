-- One advisory lock per run name, held to the end of the transaction: two processes opening the same run at once
-- (two trainers, two verl managers) take turns, and the second finds the run the first created (it resumes it or
-- is refused) instead of colliding with it on the unique name.
SELECT pg_advisory_xact_lock(hashtext('lanpo:run'), hashtext(:name))
