-- A written group's name in its trainer (verl's uid; unique within the run), the group found by its first attempt.
UPDATE rollout_groups SET trainer_uid = :uid WHERE id = (SELECT group_id FROM attempts WHERE id = :id)
