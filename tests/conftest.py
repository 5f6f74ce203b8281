"""Shared fixtures: a real Postgres + pgvector for the whole session, migrated once, each test isolated.

`LANPO_DATABASE_URL` set: a fresh database `lanpo_test_<random>` is created on that server and dropped
at the end, with its read-only role `lanpo_reader_lanpo_test_<random>`; the URL's user needs CREATEDB and
CREATEROLE (a superuser for the sandbox tests that make roles of their own). Otherwise an embedded server
is started in a temporary `LANPO_HOME`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from lanpo.db import migrate, server
from lanpo.db.connection import ENV_URL, make_db, normalise_url
from lanpo.db.models import Base

# Every vLLM engine the suite starts (in-process, in its own processes, in a bench or a trainer it spawns) holds a
# KV cache of 1 GiB, about 46,000 tokens of SmolLM2: far more than any test's batch. Sized by memory_fraction, it
# would be 0.15 of the machine's memory (3.3 GiB on 24 GiB), which took 5.6 s of every start to allocate. vLLM
# reads the variable in each engine it starts, after lanpo's own sizing (lanpo.rollout.config).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@dataclass(frozen=True)
class PgServer:
    url: str  # an empty database reserved for this test session
    home: Path | None  # LANPO_HOME of the embedded server (None: the server of LANPO_DATABASE_URL)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = os.environ.get(ENV_URL)
    if external:
        admin = sa.create_engine(normalise_url(external), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        name = f"lanpo_test_{uuid.uuid4().hex[:10]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = make_url(normalise_url(external)).set(database=name).render_as_string(hide_password=False)
        yield PgServer(url, None)
        readers = reader_roles(url)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            for role in readers:  # roles are cluster-wide: the database's reader and serving roles outlive it
                conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
        return
    # Not under pytest's basetemp: concurrent pytest sessions prune each other's basetemp folders.
    home = Path(tempfile.mkdtemp(prefix="lanpo-test-home-"))
    url = server.start(home)
    _no_fsync(url)
    yield PgServer(url, home)
    server.stop(home)
    shutil.rmtree(home, ignore_errors=True)


def _no_fsync(url: str) -> None:
    """The session's own embedded server, which nothing outlives, skips fsync. fsync guards committed rows against
    an operating-system crash only: a Postgres process killed by a test loses nothing either way, since each commit
    has written its WAL to the operating system. Measured on a busy 2-core machine: a one-row commit 3.8 ms with
    fsync, 0.6 ms without; TRUNCATE of every table 800 ms against 85 ms. The main lane alone showed no change
    beyond its noise (docs/log.md); the `db` fixture's cleanup is `empty_all` now."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("ALTER SYSTEM SET fsync = off"))
            conn.execute(sa.text("SELECT pg_reload_conf()"))
    finally:
        admin.dispose()


def reader_roles(url: str) -> list[str]:
    """The roles migrations 0004 (the reader) and 0014 (the serving role) recorded in the database at `url`."""
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with eng.connect() as conn:
            return [
                role
                for table in ("reader_login", "serve_login")
                if sa.inspect(conn).has_table(table, schema="lanpo_private")
                for role in conn.scalars(sa.text(f"SELECT role_name FROM lanpo_private.{table}"))
            ]
    finally:
        eng.dispose()


@pytest.fixture(scope="session")
def pg_url(pg_server: PgServer) -> str:
    """URL of an empty database reserved for this test session."""
    return pg_server.url


@pytest.fixture(scope="session")
def migrated_db(pg_url: str) -> Iterator[Engine]:
    """The session's database, migrated to head once."""
    eng = make_db(pg_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def truncate_all(eng: Engine) -> None:
    """Every table of lanpo's emptied as a fresh store has it: new files, ids from 1, and no planner statistics."""
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with eng.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


# The sequences of lanpo's tables: what `empty_all` restarts, as TRUNCATE ... RESTART IDENTITY would.
_OWNED_SEQUENCES = sa.text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(s.relname) FROM pg_class s "
    "JOIN pg_namespace n ON n.oid = s.relnamespace JOIN pg_depend d ON d.objid = s.oid AND d.deptype IN ('a', 'i') "
    "JOIN pg_class t ON t.oid = d.refobjid WHERE s.relkind = 'S' AND t.relname = ANY(:tables)"
)


BULK_ROWS = 5000  # past this many rows a table is truncated: DELETE's cost grows with the rows, TRUNCATE's does not


def empty_all(eng: Engine) -> None:
    """Every table of lanpo's emptied and its ids restarted at 1, by DELETE from the children up and a setval per
    sequence: what the `db` fixture does after each test. TRUNCATE gives each table and index new files, about
    280 ms a time for lanpo's 22 tables on a busy 2-core machine, against 6 ms for this, after each of the hundreds
    of tests that write to the store; a table past BULK_ROWS (a test's bulk history: DELETE took 25 s for one) is
    truncated still. Unlike TRUNCATE, DELETE leaves the planner's statistics as they were: a test that reads them
    starts from `truncate_all` (tests/db/test_stats.py)."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with eng.begin() as conn:
        bulky = " UNION ALL ".join(
            f"SELECT '{t}' WHERE EXISTS (SELECT 1 FROM \"{t}\" OFFSET {BULK_ROWS})" for t in tables
        )
        if big := conn.scalars(sa.text(bulky)).all():
            conn.execute(sa.text(f"TRUNCATE {', '.join(big)} RESTART IDENTITY CASCADE"))
        sequences = conn.scalars(_OWNED_SEQUENCES, {"tables": tables}).all()
        statements = [f'DELETE FROM "{t}"' for t in tables] + [f"SELECT setval('{s}', 1, false)" for s in sequences]
        conn.execute(sa.text("; ".join(statements)))


@pytest.fixture
def fresh_statistics(db: Engine) -> Engine:
    """The store as a fresh one has it, the planner's statistics included, for a test that asserts them
    (`assert_planned_within_growth`): the `db` fixture's DELETE between tests leaves a table's statistics as an
    earlier test left them (a table that held 300 rows reads as 300 to the planner), so such a test starts from
    TRUNCATE, as it would from a fresh store."""
    truncate_all(db)
    return db


@pytest.fixture
def db(migrated_db: Engine) -> Iterator[Engine]:
    """The migrated database; every table is emptied after the test (so tests may commit freely)."""
    yield migrated_db
    empty_all(migrated_db)


@pytest.fixture
def session(db: Engine) -> Iterator[Session]:
    """A session on the test database; whatever it commits is truncated after the test."""
    with Session(db, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def db_env(pg_url: str, db: Engine, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point lanpo (CLI, subprocesses) at the test database through LANPO_DATABASE_URL."""
    monkeypatch.setenv(ENV_URL, pg_url)
    return pg_url


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(db_env: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `lanpo ARGS...` in-process against the test database; returns exit code, stdout, stderr."""
    from lanpo.cli import main

    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core this process may use, at most 4 (each worker runs its own embedded Postgres,
    and the multi-rank tests spawn up to 8 processes of their own)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """A bound on a shared fixture's set-up (a server or an engine for a whole module), for tests marked
    `timeout(..., func_only=True)`: pytest-timeout then limits each test's own call, and a fixture that starts slowly
    on a busy machine no longer fails the test that happened to start it. Past `seconds`, SIGALRM raises in the main
    thread, naming `what`."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took over {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _no_process_left_behind() -> Iterator[None]:
    """A test that ends, passed, failed or timed out (pytest-timeout interrupts it), leaves none of the processes it
    started running: trainers, workers, ranks, vLLM engine cores. The embedded Postgres is a daemon, not a child."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker takes its own share of the cores, so that "all cores" (model.threads = 0,
    torch's default) means that share, and two workers never oversubscribe the machine; what a worker spawns
    (its embedded Postgres, trainers, ranks) inherits the share."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker is None or count < 2 or count > len(cores):
        return
    index = int(worker.removeprefix("gw")) % count  # a worker that replaces a crashed one is gw<count> and up
    share = cores[index::count]
    os.sched_setaffinity(0, share)
    os.environ["OMP_NUM_THREADS"] = str(len(share))
    # torch may be imported already (a plugin or this conftest's imports load it before this hook), its thread pool
    # sized for every core: two OpenMP threads on one pinned core wait on each other at every parallel region.
    # In the vllm lane that made a LoRA test 366 s against 10.6 s (tests/vllm_engine/test_lane.py checks the count).
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(len(share))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first, so that under xdist no worker is left with one long test at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


LONG_S = 60.0  # a test longer than this on the 2-core CI machine says why, with @pytest.mark.long("why")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > LONG_S and "long" not in report.keywords:
        _unexplained.append((report.nodeid, report.duration))


_unexplained: list[tuple[str, float]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The budget stays visible: tests over LONG_S seconds that give no reason for it are named at the end."""
    if _unexplained:
        terminalreporter.section(f"tests over {LONG_S:.0f} s without a long(reason) mark")
        for nodeid, seconds in sorted(_unexplained, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
