"""The consumer half of a training step: rollouts as padded tensors, the GRPO update, and the rows the step
writes in its one transaction."""
