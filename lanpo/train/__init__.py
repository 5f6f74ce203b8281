"""The LANPO GRPO trainer. `loop.grpo_step` is the method, read top to bottom; the folder follows it:

- `config`, `grpo_config`: the trainer's dataclasses, filled from TOML (the store client's tables, `[data]`,
  `[feedback]`, `[summarizer]`, `[reward]`, are lanpo.feedback.config's);
- `state`, `run`, `parts`, `policy`, `start`: what a step needs, built once (the run in the store, the policy and
  the start it trains from);
- `forward/`: the policy's forwards (padded batches, log-probs, the log-prob head in chunks);
- `producer/`: the step's producer half (this rank's share of the feedback prompts, generate, grade, summarise; the
  served policy; the rollout queue and its workers);
- `consumer/`: its consumer half (the GRPO update);
- `mel/`: MEL's phase of a step and what it records; `validate`: held-out validation during training;
- `plumbing/`: ranks, FSDP, checkpoints, phase timers, the test pause hook, the printed step line;
- `sft/`: the SFT warm start before RL (its pairs, a teacher that writes them, the adapter).

Imports run down: plumbing, the configs, forward, policy, consumer, sft / mel / plan, start, producer, validate,
state, loop (tests/test_layers.py holds the order).

The pure maths is in lanpo.rl, the rewards in lanpo.rewards, the modes in lanpo.feedback_modes; what any trainer
needs from the store (contexts drawn and fitted, groups and lessons recorded) in lanpo.feedback, which this calls.
"""
