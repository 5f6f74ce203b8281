"""verl's checkpoint callback (`trainer.checkpoint_callback_class`): a verl checkpoint names the store's step.

verl calls it on its driver after saving `global_step_N`; the step is committed (if it was not) and names the
folder. With `async_save` the checkpoint is not durable yet when verl calls it (verl says so and calls no more), so
the step is committed without a folder. A resumed run needs nothing from here: the manager rolls the store back to
the step verl resumes from (`lanpo.integrations.verl.store.VerlStore.begin_step`).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

from lanpo.integrations.verl.process import process_store, run_id_of

log = logging.getLogger(__name__)


class LanpoCheckpointCallback(CheckpointCallback):
    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs: Any):
        store = process_store(self.config, run_id_of(self.config))
        if async_save:
            log.warning(
                "checkpoint %s is saved asynchronously: step %s is committed without it", checkpoint_dir, global_step
            )
            store.commit_through(global_step)
            return
        store.checkpoint(global_step, checkpoint_dir)
