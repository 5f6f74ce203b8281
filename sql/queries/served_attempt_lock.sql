-- Lock served attempt :attempt_id's row until the transaction ends: its lesson is learned once, whatever number of
-- good feedbacks arrive at once (lanpo.serve.learn).
SELECT id FROM attempts WHERE id = :attempt_id FOR UPDATE
