"""vLLM's sleep mode for `lanpo.rollout.vllm.VLLMBackend` (`VLLMConfig.sleep_during_update`, CUDA only).

`sleep(level)` gives the engine's GPU memory up, `wake_up(tags)` gives it back, the weights and the KV cache
separately (vLLM's `LLM.sleep` / `LLM.wake_up(tags)`, 0.8.5 or later); the backend refuses to generate, or to load
weights or an adapter, while the part that needs sleeps (`_awake`). When a training step sleeps and wakes is the
served policy's business (`lanpo.train.producer.served_policy.ServedPolicy.sleep` and `.sync`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lanpo.errors import ConfigError, LanpoError
from lanpo.rollout.config import VLLMConfig

SLEEP_HINT = "sleep mode needs vLLM >= 0.8.5 on CUDA; set rollout.vllm.sleep_during_update = false to run without it"


class EngineSleep:
    """The sleep-mode half of VLLMBackend: it needs the backend's `llm`, `config` and `sleeping`."""

    llm: Any  # vllm.LLM
    config: VLLMConfig
    sleeping: set[str]  # what of the engine sleeps now: "weights", "kv_cache"

    def sleep(self, level: int) -> None:
        """Give the engine's GPU memory up until `wake_up` (vLLM's sleep mode: the engine must have been started
        with `sleep_during_update`): level 1 offloads the weights to host RAM and discards the KV cache, level 2
        discards both (the next load must then write every weight). The prefix cache is emptied first, so that no
        cached prefix points at KV the sleep discards."""
        if not self.config.sleep_during_update:
            raise ConfigError(
                "this vLLM engine was started without sleep mode", hint="set rollout.vllm.sleep_during_update = true"
            )
        if not self.llm.reset_prefix_cache():
            raise LanpoError(
                "vLLM kept its prefix cache before sleeping (requests were still running)",
                hint="put the engine to sleep only between generate calls",
            )
        try:
            self.llm.sleep(level=level)
        except Exception as exc:
            raise LanpoError(f"vLLM could not go to sleep: {type(exc).__name__}: {exc}", hint=SLEEP_HINT) from exc
        self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags: Sequence[str]) -> None:
        """Give back the GPU memory of `tags` ("weights", "kv_cache"): weights woken from level 1 are the ones the
        sleep offloaded, from level 2 uninitialised until a load writes them."""
        try:
            self.llm.wake_up(tags=list(tags))
        except Exception as exc:
            raise LanpoError(
                f"vLLM could not wake its {', '.join(tags)}: {type(exc).__name__}: {exc}", SLEEP_HINT
            ) from exc
        self.sleeping -= set(tags)

    def _awake(self, needed: set[str], doing: str) -> None:
        """LanpoError when a part of the engine that `doing` reads or writes sleeps: vLLM would touch memory that is
        unmapped (or, after level 2, uninitialised)."""
        asleep = needed & self.sleeping
        if asleep:
            raise LanpoError(
                f"the vLLM engine was asked to {doing} while its {' and '.join(sorted(asleep))} sleep",
                hint="wake it first (a training step wakes it in its weight sync)",
            )
