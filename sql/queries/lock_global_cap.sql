-- One advisory lock, held to the end of the transaction, serialises writers that enforce the global cap.
SELECT pg_advisory_xact_lock(hashtext('lanpo:global_cap'))
