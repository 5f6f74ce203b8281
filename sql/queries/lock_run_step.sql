-- One advisory lock per (run, step), held to the end of the transaction: the writers of one step's groups (verl's
-- agent loop workers, a user's loop writing groups as they finish) take turns, so the step's lesson cap counts the
-- lessons of every group written before this one.
SELECT pg_advisory_xact_lock(hashtext('lanpo:step'), hashtext(CAST(:run_id AS text) || ':' || CAST(:step AS text)))
