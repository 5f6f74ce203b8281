-- Crash recovery: what a trainer decided after :after_step about groups of earlier steps (trained or dropped at a
-- later consumed_step: verl's asynchronous modes) is undone; the resumed trainer's buffer holds them again.
UPDATE rollout_groups SET consumed_step = NULL, dropped = NULL
WHERE run_id = :run_id AND consumed_step > :after_step
