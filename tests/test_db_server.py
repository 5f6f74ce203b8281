"""The embedded server: reused across processes, one per data directory, back after SIGKILL with its rows."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from lanpo.db import server

pytestmark = pytest.mark.skipif(bool(os.environ.get("LANPO_DATABASE_URL")), reason="embedded server only")


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lanpo-server-test-"))
    yield path
    server.stop(path)
    shutil.rmtree(path, ignore_errors=True)


def _count(url: str) -> int:
    db = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with db.connect() as conn:
            return conn.scalar(sa.text("SELECT count(*) FROM kept"))
    finally:
        db.dispose()


def test_sigkilled_server_recovers_with_committed_rows(home: Path) -> None:
    url = server.start(home)
    db = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with db.begin() as conn:
        conn.execute(sa.text("CREATE TABLE kept (id int)"))
        conn.execute(sa.text("INSERT INTO kept SELECT generate_series(1, 100)"))
    db.dispose()
    pid = server.status(home).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.status(home).running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.status(home).running
    assert (home / "pgdata" / "postmaster.pid").exists()  # stale: what pgserver alone cannot get past

    recovered = server.start(home)
    assert server.status(home).running and server.status(home).pid != pid
    assert _count(recovered) == 100


def test_a_second_process_reuses_the_running_server(home: Path) -> None:
    url = server.start(home)
    pid = server.status(home).pid
    code = (
        "import sys; from pathlib import Path; from lanpo.db import server; "
        "server.start(Path(sys.argv[1])); print(server.status(Path(sys.argv[1])).pid)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(home)], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) == pid  # the same postmaster: never two servers on one data directory
    db = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT 1")) == 1
    db.dispose()


def test_stop_then_start(home: Path) -> None:
    server.start(home)
    assert server.stop(home) is True
    assert not server.status(home).running
    assert server.stop(home) is False
    server.start(home)
    assert server.status(home).running


@pytest.mark.skipif(os.geteuid() != 0, reason="pgserver creates its system user only under root")
def test_concurrent_first_starts_agree_on_one_system_user(tmp_path: Path) -> None:
    """Four processes make sure of one new system user at once (as two xdist workers' first servers did on a fresh
    machine): each gets the uid the user has afterwards. Unlocked, the race is a matter of timing (a CI run's
    `initdb` ran as uid 1001, gone from /etc/passwd by then; four unlocked callers here agreed), so this checks the
    contract, not the race."""
    import pwd

    name = f"lanpo{os.getpid() % 100000}"
    code = "import sys; from pathlib import Path; from lanpo.db import server; "
    code += "print(server.ensure_system_user(sys.argv[1], Path(sys.argv[2])))"
    try:
        procs = [
            subprocess.Popen([sys.executable, "-c", code, name, str(tmp_path)], stdout=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        uids = {int(p.communicate(timeout=120)[0]) for p in procs}
        assert [p.returncode for p in procs] == [0] * 4
        assert uids == {pwd.getpwnam(name).pw_uid}
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True)
