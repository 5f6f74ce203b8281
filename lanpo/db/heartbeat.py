"""A run's sign of life: the process that holds it beats, and a run whose process died reads as stale.

A trainer (rank 0) or an SFT run writes `runs.owner = "<host>:<pid>"` when it takes the run and
`runs.heartbeat_at = now()` every `HEARTBEAT_S` seconds from a daemon thread, on a connection of its own, while it
works (a step may take minutes; the beat does not wait for it). A run still `running` is

- `dead` when its owner ran on this machine and that pid is gone: certain, at once;
- `stale` when its last beat is older than `STALE_AFTER_S` by the database's clock (so machines whose clocks
  disagree agree on it), or it never beat (a run from before migration 0011);
- `alive` otherwise.

`lanpo runs` shows it, `lanpo runs fail` marks a dead or stale run failed, and `--resume` refuses a run whose owner is
alive (two trainers on one run would write the same steps).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from types import TracebackType

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.procs import pid_alive

log = logging.getLogger(__name__)

__all__ = ["Beating", "Heartbeat", "Liveness", "liveness", "owner_tag", "pid_alive"]

HEARTBEAT_S = 10.0  # seconds between beats
STALE_AFTER_S = 60.0  # a running run silent this long lost its process (six missed beats)
BEAT = sa.text("UPDATE runs SET heartbeat_at = now(), owner = :owner WHERE id = :run_id")


def owner_tag() -> str:
    """This process as a run's owner: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Liveness:
    """What a run's heartbeat says of its process."""

    state: str  # alive | stale | dead (only for a running run) | done (finished or failed)
    why: str  # one phrase, for a table or an error line

    @property
    def lost(self) -> bool:
        """The run's process is gone (or silent past the bound): it may be marked failed, or taken over."""
        return self.state in ("stale", "dead")


def liveness(
    status: str, owner: str | None, heartbeat_age_s: float | None, stale_after_s: float = STALE_AFTER_S
) -> Liveness:
    """A run's liveness from its status, owner and the age of its last beat (seconds, by the database's clock)."""
    if status != "running":
        return Liveness("done", status)
    if owner is not None:
        host, _, pid = owner.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
            return Liveness("dead", f"its process {owner} is gone")
    if heartbeat_age_s is None:
        return Liveness("stale", "it never sent a heartbeat")
    if heartbeat_age_s > stale_after_s:
        return Liveness("stale", f"its last heartbeat was {_age(heartbeat_age_s)} ago")
    return Liveness("alive", f"{owner or 'its process'} beat {_age(heartbeat_age_s)} ago")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Beating:
    """`with beating:` the body runs while a daemon thread calls `beat()` every `every` seconds. A beat that fails
    (the database restarting, say) is logged once and retried at the next one: losing a beat must not stop the work
    it reports on. A beat that returns False ends the beating (what it kept alive is gone)."""

    def __init__(self, every: float, name: str, what: str) -> None:
        self.every, self.what = every, what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._warned = False

    def beat(self) -> bool | None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                if self.beat() is False:
                    return
                self._warned = False
            except Exception as exc:
                if not self._warned:
                    log.warning("%s failed (retrying every %.0f s): %s", self.what, self.every, exc)
                    self._warned = True

    def __enter__(self) -> Beating:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 5)


class Heartbeat(Beating):
    """`with Heartbeat(engine, run_id):` the body's process holds run `run_id` and beats while the body runs.

    The first beat is written before the body starts (the run is taken before any work); the next ones by a daemon
    thread every `every` seconds (`Beating`)."""

    def __init__(self, db: Engine, run_id: int, every: float = HEARTBEAT_S) -> None:
        super().__init__(every, f"lanpo-heartbeat-{run_id}", f"heartbeat of run {run_id}")
        self.db, self.run_id = db, run_id
        self.owner = owner_tag()

    def beat(self) -> None:
        with self.db.begin() as conn:
            conn.execute(BEAT, {"owner": self.owner, "run_id": self.run_id})

    def __enter__(self) -> Heartbeat:
        self.beat()
        super().__enter__()
        return self
