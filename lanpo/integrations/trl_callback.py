"""The TRL callback of lanpo's TRL integration (`TRLStore.callback`): it opens the run before step 1, sets p_t for
each step, ties each TRL checkpoint to the store's step, copies TRL's logs into run_metrics and finishes the run,
each by calling the store (`StoreHooks`: what lanpo.integrations.trl.TRLStore offers it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class StoreHooks(Protocol):
    """What the callback calls on the store, at TRL's events."""

    p_t: float
    p_t_of: Callable[[int], float]

    def begin(self, args: Any, state: Any, model: Any, dataset: Any) -> None: ...

    def saved(self, step: int, folder: Path) -> None: ...

    def logged(self, step: int, logs: dict[str, Any]) -> None: ...

    def end(self, failed: bool = False) -> None: ...


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class StoreCallback(_callback_base()):  # type: ignore[misc]
    """The TRL callback: opens the run, sets p_t per step, ties checkpoints to steps, finishes the run."""

    def __init__(self, store: StoreHooks) -> None:
        self.store = store

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None, **kwargs: Any
    ) -> None:
        dataset = getattr(train_dataloader, "dataset", None)
        self.store.begin(args, state, model, dataset)
        self.store.p_t = self.store.p_t_of(state.global_step + 1)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.store.p_t = self.store.p_t_of(state.global_step + 1)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.store.saved(state.global_step, Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # state.log_history holds the numbers: transformers' progress callback, called first, formats `logs` in place
        last = state.log_history[-1] if state.log_history else {}
        self.store.logged(state.global_step, {k: v for k, v in last.items() if k != "step"})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.store.end()
