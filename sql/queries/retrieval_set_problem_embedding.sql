-- Fill one problem's embedding (only when still missing, so a concurrent embedder never overwrites).
UPDATE problems SET embedding = CAST(:embedding AS vector) WHERE id = :id AND embedding IS NULL
