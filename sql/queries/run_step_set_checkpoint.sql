-- Name the checkpoint that holds a committed step (a trainer that checkpoints after its store commit: TRL).
UPDATE run_steps SET checkpoint = :checkpoint WHERE run_id = :run_id AND step = :step
