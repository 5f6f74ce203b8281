"""A run whose process died is visible: heartbeats, `lanpo runs`, `lanpo runs fail`, and `--resume` refusing a run
whose process is alive. Real processes, killed with real signals at a random moment of their work."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.heartbeat import Heartbeat, liveness, owner_tag, pid_alive
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import InputError

# A process that takes run NAME and works (beating every 0.2 s) until it is killed.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from lanpo.db.connection import connect, transaction
    from lanpo.db.heartbeat import Heartbeat
    from lanpo.db.repo import runs
    engine = connect()
    with transaction(engine) as session:
        run_id = runs.create_run(session, sys.argv[1], "train").id
    with Heartbeat(engine, run_id, every=0.2):
        print("ready", flush=True)
        while True:
            sum(i * i for i in range(10_000))  # busy, as a step is
    """
)


@contextmanager
def holder(name: str) -> Iterator[subprocess.Popen[str]]:
    """A separate process holding run `name`, beating; killed (SIGKILL) on the way out if still alive."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _row(db: Engine, name: str) -> runs_repo.RunRow:
    with transaction(db) as session:
        [row] = runs_repo.list_runs(session, [name])
    return row


def test_liveness_reads_status_owner_and_age() -> None:
    here = owner_tag()
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = here.rsplit(":", 1)[0]
    assert liveness("finished", here, 3.0).state == "done"
    assert liveness("running", here, 3.0).state == "alive"
    assert liveness("running", here, 61.0).state == "stale"  # alive pid, but silent past the bound
    assert liveness("running", f"{host}:{gone.pid}", 0.5).state == "dead"  # its pid is gone on this machine
    assert liveness("running", f"elsewhere:{gone.pid}", 0.5).state == "alive"  # another machine: only the age
    assert liveness("running", "elsewhere:1", 600.0).why == "its last heartbeat was 10 min ago"
    assert liveness("running", None, None).state == "stale"  # never beat (a run from before migration 0011)
    assert pid_alive(os.getpid()) and not pid_alive(gone.pid)


def test_a_sigkilled_process_leaves_a_dead_run_that_runs_shows_and_fail_marks(db: Engine, run_cli: Callable) -> None:
    with holder("killed") as proc:
        time.sleep(random.uniform(0.1, 1.0))  # a random moment of its work
        beating = _row(db, "killed")
        assert beating.liveness().state == "alive" and beating.owner == f"{owner_tag().rsplit(':', 1)[0]}:{proc.pid}"
        out = run_cli("runs").out
        assert "killed" in out and " running " in out
        refused = run_cli("runs", "fail", "killed")
        assert refused.code == 2 and "is alive" in refused.err and "hint:" in refused.err
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    dead = _row(db, "killed")
    assert dead.status == "running" and dead.liveness().state == "dead"  # no one could mark it: it reads dead
    listed = run_cli("runs")
    assert " dead " in listed.out and "lanpo runs fail killed" in listed.err
    done = run_cli("runs", "fail", "killed")
    assert done.code == 0 and "marked failed" in done.out
    assert _row(db, "killed").status == "failed"
    again = run_cli("runs", "fail", "killed")
    assert again.code == 2 and "already failed" in again.err


def test_a_silent_run_on_another_machine_turns_stale_by_the_database_clock(db: Engine, run_cli: Callable) -> None:
    """Another machine's pid cannot be looked up: only the age of its last beat says it is gone."""
    with transaction(db) as session:
        run = runs_repo.create_run(session, "remote", "train")
        session.execute(
            sa.text(
                "UPDATE runs SET owner = 'elsewhere:4242', heartbeat_at = now() - interval '5 seconds' WHERE id = :r"
            ),
            {"r": run.id},
        )
    assert _row(db, "remote").liveness().state == "alive"
    assert _row(db, "remote").liveness(stale_after_s=2).state == "stale"
    assert run_cli("runs", "fail", "--stale").out.strip() == "no run lost its process"  # 5 s < the 60 s bound
    marked = run_cli("runs", "fail", "--stale", "--stale-after", "2")
    assert "run 'remote' marked failed (its last heartbeat was 5 s ago" in marked.out
    assert run_cli("runs", "--running").out.strip() == "no runs matching"


def test_resume_refuses_a_run_whose_process_is_alive_and_takes_over_a_dead_one(db: Engine, db_env: str) -> None:
    with holder("held") as proc:
        with transaction(db) as session, pytest.raises(InputError, match=r"still running: .* beat") as err:
            runs_repo.require_lost(session, runs_repo.get_run(session, "held"), "resumed")
        assert "stop that process first" in (err.value.hint or "")
        proc.kill()
        proc.wait(timeout=30)
    with transaction(db) as session:
        runs_repo.require_lost(session, runs_repo.get_run(session, "held"), "resumed")  # dead: taken over


def test_the_heartbeat_goes_on_while_the_body_works_and_survives_a_failed_beat(db: Engine) -> None:
    with transaction(db) as session:
        run_id = runs_repo.create_run(session, "beating", "train").id
    with Heartbeat(db, run_id, every=0.1) as beat:
        first = _row(db, "beating").heartbeat_age_s
        assert first is not None and first < 1.0
        real, calls = beat.beat, []

        def flaky() -> None:  # the database unreachable for one beat
            calls.append(1)
            if len(calls) == 1:
                raise OSError("connection refused")
            real()

        beat.beat = flaky  # type: ignore[method-assign]
        time.sleep(1.0)
        assert len(calls) >= 3
        age = _row(db, "beating").heartbeat_age_s
        assert age is not None and age < 0.5
    stopped = _row(db, "beating").heartbeat_age_s
    time.sleep(0.3)
    assert _row(db, "beating").heartbeat_age_s > stopped  # type: ignore[operator]  # no beat after the body
