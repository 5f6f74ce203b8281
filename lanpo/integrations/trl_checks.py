"""What lanpo's TRL integration (lanpo.integrations.trl) refuses before it serves a step: a layout whose groups it
cannot keep whole, prompts that are not whole groups. (A run name taken by another kind of run is refused where
every trainer opens its run: `lanpo.feedback.lifecycle.check_run`.)
"""

from __future__ import annotations

from typing import Any

from lanpo.errors import ConfigError

TRAINER = "trl"  # runs.config->>'trainer' of a run the integration writes


def check_layout(args: Any) -> None:
    """Refuse a layout whose groups the integration cannot serve: each process's generation batch must hold whole
    groups of num_generations (TRL itself checks only the global batch), in one process."""
    n = args.num_generations
    per_process = args.per_device_train_batch_size * args.steps_per_generation
    if n < 2:
        raise ConfigError(f"num_generations = {n}: a GRPO group needs at least 2", hint="set num_generations >= 2")
    if per_process % n:
        raise ConfigError(
            f"each process generates {per_process} completions (per_device_train_batch_size x steps_per_generation), "
            f"not a multiple of num_generations = {n}: a group would straddle processes or generation batches",
            hint=f"make per_device_train_batch_size x steps_per_generation a multiple of {n}",
        )
    world = getattr(args, "world_size", 1)
    if world > 1:
        raise ConfigError(
            f"lanpo's TRL integration runs in one process; this launch has {world}",
            hint="launch one process (python script.py), or train with lanpo train under torchrun",
        )


def whole_groups(prompts: list[Any], n: int) -> int:
    """How many groups `prompts` holds: each prompt repeated n times in a row (TRL's RepeatSampler)."""
    if len(prompts) % n:
        raise ConfigError(
            f"rollout_func got {len(prompts)} prompts, not whole groups of num_generations = {n}",
            hint="make per_device_train_batch_size x steps_per_generation a multiple of num_generations",
        )
    for g in range(len(prompts) // n):
        if any(prompts[g * n + j] != prompts[g * n] for j in range(1, n)):
            raise ConfigError(
                f"rollout_func's prompts {g * n}..{g * n + n - 1} are not one prompt repeated {n} times",
                hint="use TRL's default sampler (RepeatSampler); a custom sampler must keep each group together",
            )
    return len(prompts) // n
