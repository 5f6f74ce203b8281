"""The consumer half of a training step: the GRPO update, and the rows the step writes in its one transaction
(its padded batches and log-probs are `lanpo.train.forward`'s)."""
