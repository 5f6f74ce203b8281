-- Mark (run, step) committed: the trainer's last statement in the step's transaction.
INSERT INTO run_steps (run_id, step, policy_version_id, checkpoint)
VALUES (:run_id, :step, :policy_version_id, :checkpoint)
