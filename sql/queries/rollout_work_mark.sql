-- The trainer's verdict on finished work :id: used (in the step's committing transaction) or dropped (too stale).
UPDATE rollout_work SET status = :status WHERE id = :id AND status = 'done'
RETURNING id
