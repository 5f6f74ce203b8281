"""verl's asynchronous replay buffer with lanpo's store: every group a step trains, and every group verl drops with
its reason, recorded; the step commits at its end (its checkpoint, or the next step's dispatch), once verl has
handed it its whole batch (in `parameter_sync_step` parts under separate_async).

verl's V1 trainer in `colocate_async` or `separate_async` mode trains a group at a later step than the one that
dispatched it, and its sampler (`verl.trainer.ppo.v1.replay_buffer.ReplayBufferAsync`) chooses which finished
groups a step trains and evicts the others: too many policy versions behind (`max_off_policy_threshold` with the
`drop` strategy: `stale`), no reward spread (`algorithm.filter_groups`: `filtered`), or a failed session
(`failed`). verl has no "groups finished" callback; this subclass is plugged in where verl takes a custom sampler:

    trainer.v1.sampler.custom_sampler.path=pkg://lanpo.integrations.verl.sampler
    trainer.v1.sampler.custom_sampler.name=LanpoReplayBuffer

It runs in the process of verl's trainer, where lanpo's agent loop manager opened the run; the groups it names
were written by the agent loop workers before verl saw them finish (`lanpo.integrations.verl.manager`).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from lanpo.errors import ConfigError
from lanpo.integrations.verl.process import driver_store

log = logging.getLogger(__name__)
TRAIN = "train"  # verl's training partition (validation, "val", is verl's and not recorded)


class LanpoReplayBuffer(ReplayBufferAsync):
    """`ReplayBufferAsync`, recording each step's trained and dropped groups in lanpo's store."""

    def __init__(self, trainer_mode: str, *args: Any, **kwargs: Any) -> None:
        if trainer_mode == "sync":
            raise ConfigError(
                "lanpo's replay buffer is for verl's asynchronous trainer modes; in sync mode every group trains "
                "in the step that dispatched it",
                hint="leave trainer.v1.sampler.custom_sampler unset with trainer.v1.trainer_mode=sync",
            )
        super().__init__(trainer_mode, *args, **kwargs)

    def _evict_terminal_groups(
        self, global_steps: int, partition_id: str, eviction_reasons: tuple[set[str], set[str], set[str], Any]
    ) -> tuple[set[str], int, int, dict]:
        evicted, stale, filtered, metrics = super()._evict_terminal_groups(
            global_steps, partition_id, eviction_reasons
        )
        if partition_id == TRAIN and evicted:
            metrics.update(driver_store().consume(global_steps, (), drop_reasons(eviction_reasons)))
        return evicted, stale, filtered, metrics

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == TRAIN:
            uids = sorted({key.split("_", 1)[0] for key in batch.keys})  # verl's keys: {uid}_{session}_{index}
            metrics.update(driver_store().consume(global_steps, uids, {}))  # the step commits at its end
        return batch, metrics


def drop_reasons(eviction_reasons: tuple[set[str], set[str], set[str], Any]) -> dict[str, str]:
    """uid -> why verl evicts it, from `_terminal_eviction_reasons`' (stale, filtered, failed, counts); a group in
    several sets is named by the first: staleness is decided before the group's rewards are read."""
    stale, filtered, failed = eviction_reasons[:3]
    reasons: dict[str, str] = {}
    for reason, uids in (("stale", stale), ("filtered", filtered), ("failed", failed)):
        for uid in uids:
            reasons.setdefault(uid, reason)
    return reasons


if __name__ == "__main__":  # what to pass to verl
    print("trainer.v1.sampler.custom_sampler.path=pkg://lanpo.integrations.verl.sampler")
    print("trainer.v1.sampler.custom_sampler.name=LanpoReplayBuffer")
