-- Retire an active lesson by hand (lanpo pool retire): evicted now, by 'manual:retired', with a person's reason. No
-- run or step names it, so a resume's rollback never brings it back. Returns nothing when it was not active.
UPDATE experiences SET evicted_at = now(), evicted_by = 'manual:retired', evicted_note = :note
WHERE id = :experience_id AND evicted_at IS NULL
RETURNING evicted_at
