-- The rollout group of each of :attempt_ids (MEL names a lesson's replay group by its first replay attempt).
SELECT id, group_id FROM attempts WHERE id = ANY(CAST(:attempt_ids AS bigint[]))
