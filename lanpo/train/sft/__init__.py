"""The SFT warm start before RL: its chat pairs (from worked solutions, or written by a teacher and verified) and
the LoRA adapter trained on them."""
