-- The lesson versions a report's runs used (a use: one of their rollout groups whose context held the version,
-- a row of lesson_uses), each once, with its record as lesson_history gives it: uses and graded attempts over the
-- whole store, lift with its 95 % interval, and its probation state; run_uses counts the runs' own uses of it
-- (lanpo report's lesson_lift.png and lesson_lift.csv).
WITH used AS (
    SELECT lu.version_id, count(*) AS run_uses
    FROM lesson_uses lu
    JOIN rollout_groups g ON g.id = lu.group_id
    WHERE g.run_id = ANY(CAST(:run_ids AS bigint[]))
    GROUP BY lu.version_id
)
SELECT h.experience_id, h.version_id, h.version, used.run_uses, h.uses, h.graded, h.lift, h.lift_low, h.lift_high,
       h.probation
FROM used
JOIN lesson_history h ON h.version_id = used.version_id
ORDER BY h.experience_id, h.version
