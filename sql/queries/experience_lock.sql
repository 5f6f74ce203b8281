-- Lock one experience (existence check + serialises version appends to it).
SELECT id FROM experiences WHERE id = :experience_id FOR NO KEY UPDATE
