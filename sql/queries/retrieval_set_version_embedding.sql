-- Fill one experience version's embedding; the immutability trigger allows exactly this (NULL -> value, once).
UPDATE experience_versions SET embedding = CAST(:embedding AS vector) WHERE id = :id AND embedding IS NULL
