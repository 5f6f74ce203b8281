"""lanpo's store inside other trainers: `lanpo.integrations.trl` for TRL's GRPOTrainer (docs/trl.md)."""
