"""A test hook: make a training step stop at a phase, so a test can kill the process there.

`LANPO_TRAIN_PAUSE_AT=phase:step` (phases: generate, db_write) makes step `step` announce
`lanpo-paused phase:step` on stderr and sleep; tests/train/test_resume.py then sends SIGKILL. Where in the phase
it stops: `lanpo.train.plumbing.timing.AROUND`.
"""

from __future__ import annotations

import os
import sys
import time

PAUSE_ENV = "LANPO_TRAIN_PAUSE_AT"


def pause(phase: str, step: int) -> None:
    """With LANPO_TRAIN_PAUSE_AT=phase:step, announce on stderr and sleep (the test kills us)."""
    if os.environ.get(PAUSE_ENV) == f"{phase}:{step}":
        print(f"lanpo-paused {phase}:{step}", file=sys.stderr, flush=True)
        time.sleep(3600)
