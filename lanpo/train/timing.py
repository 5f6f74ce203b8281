"""Seconds per phase of one training step, kept out of the step's own code: `with timer.phase("generate"): ...`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

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
