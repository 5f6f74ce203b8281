-- Groups a re-issue replaces (their attempts and contexts cascade).
DELETE FROM rollout_groups WHERE id = ANY(:group_ids)
