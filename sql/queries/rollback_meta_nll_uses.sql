-- Crash recovery: MEL's NLL uses of steps after the last checkpointed one.
DELETE FROM meta_nll_uses WHERE run_id = :run_id AND step > :after_step
