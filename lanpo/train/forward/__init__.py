"""The policy's forwards, below both the policy and the update: rollouts as padded tensors (`batch`), their
per-token log-probs (`logprobs`), and the log-prob head in chunks (`chunking` sizes them, `chunked` runs them)."""
