"""The producer half of a training step: the step's prompts with their feedback contexts, n rollouts each, their
rewards and the summaries of the successful ones; in the trainer's process or in rollout workers fed by a queue."""
