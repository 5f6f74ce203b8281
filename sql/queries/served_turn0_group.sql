-- The turn-0 rollout group of a final attempt: its own group, or (self-correction) the group its chain of
-- context attempts starts from.
WITH RECURSIVE chain AS (
    SELECT a.group_id, 0 AS depth FROM attempts a WHERE a.id = :attempt_id
    UNION ALL
    SELECT earlier.group_id, c.depth + 1
    FROM chain c
    JOIN group_contexts gc ON gc.group_id = c.group_id AND gc.context_attempt_id IS NOT NULL
    JOIN attempts earlier ON earlier.id = gc.context_attempt_id
    WHERE c.depth < 64
)
SELECT group_id FROM chain ORDER BY depth DESC LIMIT 1
