-- One advisory lock per dataset name, held to the end of the transaction: two processes that import or generate the
-- same dataset at once (two runs of an experiment creating their shared validation set) take turns, and the second
-- finds the first's rows instead of colliding with them on (dataset, external_id).
SELECT pg_advisory_xact_lock(hashtext('lanpo:dataset'), hashtext(:dataset))
