"""The store of a verl run as one process holds it: one `VerlStore` (one connection pool) per process and run, and
the group draws its samples share. No verl import (the main lane tests it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lanpo.errors import ConfigError
from lanpo.integrations.verl.store import GroupPrompt, Settings, VerlStore

_lock = threading.Lock()
_stores: dict[tuple[Any, ...], VerlStore] = {}
_driver: list[VerlStore] = []  # the store lanpo's agent loop manager opened the run with, in verl's trainer process


def verl_shape(verl_config: Mapping[str, Any]) -> tuple[str, int, int]:
    """(model path, n, prompt length) of a verl config: what the store needs of verl's own keys."""
    ref = verl_config["actor_rollout_ref"]
    rollout = ref["rollout"]
    return str(ref["model"]["path"]), int(rollout["n"]), int(rollout["prompt_length"])


def process_store(verl_config: Mapping[str, Any], run_id: int | None = None) -> VerlStore:
    """This process's store for the run the config names (created on first use; thread-safe)."""
    settings = Settings.of(verl_config)
    model, _, prompt_length = verl_shape(verl_config)
    key = (settings, model, prompt_length)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = VerlStore(settings, model, prompt_length)
    if store.run is None and run_id is not None:
        store.attach(run_id)
    return store


def set_driver_store(store: VerlStore) -> None:
    """The store of the run this process's agent loop manager opened (verl's trainer process)."""
    with _lock:
        _driver[:] = [store]


def driver_store() -> VerlStore:
    """The store the agent loop manager of this process opened: what verl's sampler (`LanpoReplayBuffer`), built
    by verl's trainer before the manager, records each step's groups in."""
    with _lock:
        if not _driver:
            raise ConfigError(
                "lanpo's replay buffer runs in a process where lanpo's agent loop manager opened no run",
                hint="set actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                "lanpo.integrations.verl.LanpoAgentLoopManager",
            )
        return _driver[0]


def run_id_of(verl_config: Mapping[str, Any]) -> int:
    """The run the manager opened (it writes `lanpo.run_id` into the config its workers get)."""
    run_id = (verl_config.get("lanpo") or {}).get("run_id")
    if run_id is None:
        raise ConfigError(
            "the lanpo agent loop runs without lanpo's agent loop manager, which opens the run and writes it back",
            hint="set actor_rollout_ref.rollout.agent.agent_loop_manager_class="
            "lanpo.integrations.verl.LanpoAgentLoopManager",
        )
    return int(run_id)


class GroupDraws:
    """One draw per group (step, uid), shared by its n samples: the first sample draws, the others await it."""

    def __init__(self) -> None:
        self._drawn: dict[tuple[int, str], asyncio.Future[GroupPrompt]] = {}

    async def get(self, step: int, uid: str, draw: Callable[[], Awaitable[GroupPrompt]]) -> GroupPrompt:
        key = (step, uid)
        found = self._drawn.get(key)
        if found is None:
            found = self._drawn[key] = asyncio.ensure_future(draw())
        # shielded: a cancelled sample (an aborted request) leaves its siblings' shared draw running
        return await asyncio.shield(found)

    def forget(self, step: int, uid: str) -> GroupPrompt | None:
        """The group's draw, dropped once the group is written back (or failed)."""
        found = self._drawn.pop((step, uid), None)
        if found is None or not found.done() or found.cancelled() or found.exception() is not None:
            return None
        return found.result()


DRAWS = GroupDraws()  # the worker process's draws: its agent loops (one per sample) and its write-back share them
