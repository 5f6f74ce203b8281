"""LANPO GRPO trainer: config, the loop, checkpoints, SFT warm start, summarizer."""
