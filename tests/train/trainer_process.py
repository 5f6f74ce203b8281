"""`lanpo train` as a real process, stopped at a phase (`lanpo.train.plumbing.pause`): the crash, kill and SIGTERM
tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lanpo.train.plumbing.pause import PAUSE_ENV

CLI = "import sys; from lanpo.cli import main; sys.exit(main())"


def launch(config: Path, pause: str | None, resume: bool = False) -> subprocess.Popen[str]:
    """`lanpo train --config CONFIG` offline; with `pause` ("phase:step") it stops there and says so on stderr."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV] = pause
    args = [sys.executable, "-c", CLI, "train", "--config", str(config), "--no-progress"]
    return subprocess.Popen(args + (["--resume"] if resume else []), env=env, stderr=subprocess.PIPE, text=True)


def wait_for_pause(proc: subprocess.Popen[str], pause: str, timeout: float = 240) -> list[str]:
    """Block until the trainer announces `pause`; its stderr lines so far. Fails the test (and kills the trainer)
    if it exits or runs past `timeout` first, silent or not."""
    marker = f"lanpo-paused {pause}"
    seen = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not seen.is_set():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"trainer never reached {marker!r}; stderr:\n{''.join(lines)[-3000:]}")
        time.sleep(0.05)
    return lines


def kill_when_paused(
    proc: subprocess.Popen[str], pause: str, timeout: float = 240, sig: int = signal.SIGKILL
) -> list[str]:
    """Wait for the trainer to reach `pause`, then send `sig` (SIGKILL: no cleanup runs); all its stderr lines."""
    lines = wait_for_pause(proc, pause, timeout)
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    assert proc.stderr is not None
    return lines + proc.stderr.readlines()
