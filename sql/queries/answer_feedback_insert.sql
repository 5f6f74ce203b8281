-- A reward and/or verdict on one attempt; appended, never updated (the latest verdict is the attempt's).
INSERT INTO answer_feedback (attempt_id, reward, correct, gold_answer, key_name)
VALUES (:attempt_id, :reward, :correct, :gold_answer, :key_name)
RETURNING id
