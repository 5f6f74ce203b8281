-- Recompute the lesson_usefulness rows of the given versions from their lesson_uses rows (run it after
-- usefulness_lock.sql and usefulness_uses_recompute.sql, in a new statement: under READ COMMITTED it sees every use
-- committed while it waited, and this transaction's own). uses counts the rows, helped / hurt / even / unknown them
-- by outcome (1 / -1 / 0 / NULL), graded, credit and credit_var are their sums (credit_var: the
-- variance of credit, the uses taken as independent). A version with no use left gets zeros.
WITH targets AS (
    SELECT version_id FROM lesson_usefulness WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
)
INSERT INTO lesson_usefulness AS lu (version_id, uses, helped, hurt, even, unknown, graded, credit, credit_var,
                                     updated_at)
SELECT t.version_id,
       count(u.group_id),
       count(*) FILTER (WHERE u.outcome > 0),
       count(*) FILTER (WHERE u.outcome < 0),
       count(*) FILTER (WHERE u.outcome = 0),
       count(u.group_id) FILTER (WHERE u.outcome IS NULL),
       coalesce(sum(u.graded), 0),
       coalesce(sum(u.credit ORDER BY u.group_id), 0),  -- in one order: a recompute gives the same bits
       coalesce(sum(u.credit_var ORDER BY u.group_id), 0),
       now()
FROM targets t
LEFT JOIN lesson_uses u ON u.version_id = t.version_id
GROUP BY t.version_id
ON CONFLICT (version_id) DO UPDATE
SET uses = EXCLUDED.uses, helped = EXCLUDED.helped, hurt = EXCLUDED.hurt, even = EXCLUDED.even,
    unknown = EXCLUDED.unknown, graded = EXCLUDED.graded, credit = EXCLUDED.credit,
    credit_var = EXCLUDED.credit_var, updated_at = EXCLUDED.updated_at
