"""Seconds per phase of one training step, kept out of the step's own code: `with phase("generate"): ...`.

`Phases` is what the step wraps each phase in: its timer, and from one table what else runs around the phase.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from lanpo.train.plumbing.pause import pause

# The store's share of a step: drawing the contexts before generation, and the step's one transaction.
STORE_PHASES = ("context", "db_write")


class StepTimer:
    """Wall seconds per named phase, plus the whole step's wall and CPU (all threads) time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self, seconds: dict[str, float] | None = None) -> dict[str, float]:
        """`time/<phase>` (of `seconds`, default this timer's), `time/step`, `time/cpu_step`, `time/pool_share`."""
        phases = self.seconds if seconds is None else seconds
        step = time.perf_counter() - self._wall
        out = {f"time/{name}": value for name, value in phases.items()}
        out["time/step"] = step
        out["time/cpu_step"] = time.process_time() - self._cpu  # all threads: above wall when the cores are ours
        out["time/pool_share"] = sum(phases.get(name, 0.0) for name in STORE_PHASES) / step if step > 0 else 0.0
        return out


# What runs around a phase beside its timer. "generating": the policy holds its full weights (`policy.generating()`:
# a sharded FSDP policy gathers them for the hf backend, which generates with it; otherwise nothing happens).
# "pause before" / "pause after": the test hook (`lanpo.train.plumbing.pause`) may stop the step there: before it
# generates, and after its rows are written, inside the step's still uncommitted transaction.
AROUND: dict[str, tuple[str, ...]] = {
    "generate": ("pause before", "generating"),
    "summarize": ("generating",),
    "mel": ("generating",),
    "db_write": ("pause after",),
}


class Phases:
    """A step's phases: `with phase(name): ...` times the phase and runs what `AROUND` names around it."""

    def __init__(self, policy: Any, step: int) -> None:
        self.timer = StepTimer()
        self._policy = policy  # lanpo.train.policy.Policy
        self._step = step

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        around = AROUND.get(name, ())
        if "pause before" in around:
            pause(name, self._step)
        with self.timer.phase(name), self._policy.generating() if "generating" in around else nullcontext():
            yield
        if "pause after" in around:
            pause(name, self._step)

    def took(self, **seconds: float) -> None:
        """Phases timed elsewhere (the update times its own two): `took(update=1.5)`."""
        for name, value in seconds.items():
            self.timer.add(name, value)
