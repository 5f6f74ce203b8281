"""What a training step runs on but is not the method: ranks and their gathers, FSDP, checkpoints, phase timers,
the test pause hook, the printed step line."""
