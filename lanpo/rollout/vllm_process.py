"""How a vLLM engine lives beside lanpo's own code: in this process (`rollout.vllm.reproducible` on CPU) or in
processes of its own, and what an in-process engine changes in its caller that lanpo puts back.

- `reproducible_env`: the variables vLLM reads at start for the switch (docs/reproducibility.md).
- `environment`: them, set while the engine starts; vLLM's frozen reading of the environment thawed first.
- `process_state_kept`: the caller's random generators and `torch.set_num_threads`, restored after the start.
- `LIVE_IN_PROCESS` / `parallel_state_kept`: several in-process engines share vLLM's parallel state, which only
  the last one to close may tear down.
- `cpu_node_memory`: the NUMA node's memory, what lanpo sizes an in-process engine's KV cache against.

Imports no vLLM at module level: configs and tests read it on any machine.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

# Engines whose core runs in this process. They share vLLM's process-wide parallel state (its model-parallel
# groups), which an in-process EngineCore tears down when it shuts down: the others would then fail their next
# forward ("pipeline model parallel group is not initialized"). So only the last one to close tears it down.
LIVE_IN_PROCESS: set[int] = set()


@contextlib.contextmanager
def parallel_state_kept(keep: bool) -> Iterator[None]:
    """While an in-process engine shuts down with others still live, its teardown of vLLM's parallel state
    (`vllm.v1.engine.core.cleanup_dist_env_and_memory`, vLLM 0.32) is reduced to the garbage collection."""
    if not keep:
        yield
        return
    from vllm.v1.engine import core

    teardown = core.cleanup_dist_env_and_memory
    core.cleanup_dist_env_and_memory = lambda *args, **kwargs: (gc.unfreeze(), gc.collect())
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = teardown


def cpu_node_memory() -> int:
    """Bytes of memory on the NUMA node vLLM's CPU worker binds to (the first CPU this process may use)."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        return int(get_memory_node_info(get_allowed_cpu_list()[0].numa_node).total_memory)
    except (ImportError, AttributeError, IndexError):  # another vLLM layout: the machine's memory
        import psutil

        return int(psutil.virtual_memory().total)


def reproducible_env(device: str, reproducible: bool) -> dict[str, str]:
    """The variables vLLM reads at engine start for `rollout.vllm.reproducible` on `device`: on CPU the engine core
    in this process (deterministic scheduling, vLLM's docs: "Reproducibility"), on a GPU batch invariance."""
    if not reproducible:
        return {}
    if device == "cpu":
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {"VLLM_BATCH_INVARIANT": "1"}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ while the engine starts (its processes inherit them), the old values back after. An
    engine core started in this process freezes vLLM's reading of the environment (`enable_envs_cache`); it is
    thawed first, so that a later engine reads its own settings."""
    with contextlib.suppress(ImportError, AttributeError):
        from vllm import envs

        envs.disable_envs_cache()
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """What an engine started in this process changes, put back: it seeds Python's, numpy's and torch's global
    random states with `vllm.seed` (vLLM warns that it "may affect the random state" of the caller), and vLLM's CPU
    worker replaces `torch.set_num_threads` with a no-op (it binds OpenMP threads in worker processes, which the
    in-process engine does not), which would silently pin the trainer to the engine's thread count."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
