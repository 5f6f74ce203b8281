"""Processes on this machine: whether one is alive, and a tag naming it that a reused pid cannot match.

Three watchers read them: a run's heartbeat (`lanpo.db.heartbeat`: is the owner's pid gone?), a vLLM engine's
worker (`lanpo.rollout.vllm_worker`: end the EngineCore once the process that started it is gone) and a local
rollout worker (`lanpo.train.producer.worker`: end with the trainer that started it). No torch here: the vLLM engine's
worker imports it at start-up, and so does `lanpo runs`.
"""

from __future__ import annotations

import os


def start_time(pid: int) -> str | None:
    """Process `pid`'s start time (clock ticks since boot, /proc/<pid>/stat field 22), so that a reused pid is not
    taken for the process it once named; None when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def process_tag(pid: int | None = None) -> str:
    """ "<pid>:<start time>" of process `pid` (default: this one): what `tag_gone` checks."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid)}"


def tag_gone(tag: str) -> bool:
    """Whether the process `process_tag` named is gone (its pid exits, or now names another process)."""
    pid, _, start = tag.partition(":")
    if start == "None":  # tagged where /proc could not be read: only the pid can be checked
        return not pid_alive(int(pid))
    return start_time(int(pid)) != start


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc here: os.kill said it exists
