-- A lesson `lanpo serve` learned (migration 0022): its scope and the feedback it was learned from, set on the
-- experiences `add_experiences` just inserted, in the same transaction.
UPDATE experiences SET scope = :scope, feedback_id = :feedback_id
WHERE id = ANY(CAST(:ids AS bigint[]))
