"""User-facing errors: every one says what went wrong and what to do about it."""

from __future__ import annotations

import difflib
import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

HINT_LIMIT = 200  # characters: a hint says what to do in a line; a list that grows with the store is cut short


def listing(names: Iterable[str], room: int = 100, every: str | None = None) -> str:
    """`a, b, c` while it fits in `room` characters, then `and N more` (and the command `every` that lists them
    all): a hint that lists what the store holds stays short however much it holds."""
    names = list(names)
    shown: list[str] = []
    for name in names:
        if shown and len(", ".join([*shown, name])) > room:
            break
        shown.append(name)
    more = len(names) - len(shown)
    if not more:
        return ", ".join(shown)
    return ", ".join(shown) + f" and {more} more" + (f" (`{every}`)" if every else "")


def nearest_first(name: str, names: Iterable[str]) -> list[str]:
    """`names` sorted, the (up to 3) most like `name` first: a hint that lists them names a near miss however many
    there are."""
    names = sorted(names)
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return [*near, *(n for n in names if n not in near)]


class LanpoError(Exception):
    """An error the CLI prints without a traceback: `message`, then `hint` (what to do, one line under
    HINT_LIMIT characters), then `detail` when the hint points at text to copy verbatim (the SQL an administrator
    runs), each of its lines indented under the hint."""

    def __init__(self, message: str, hint: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail

    def __str__(self) -> str:
        text = self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"
        return text if not self.detail else f"{text}\n{indented(self.detail)}"


def indented(detail: str) -> str:
    """`detail` as printed under a hint: a blank line, then each line indented by four spaces."""
    return "\n" + "\n".join(f"    {line}" if line else "" for line in detail.splitlines())


class ConfigError(LanpoError):
    """A configuration key is unknown, has the wrong type, or an impossible value."""


class DatabaseUnavailable(LanpoError):
    """The database cannot be reached."""


class NotMigrated(LanpoError):
    """The database is reachable but its schema is missing or behind the code."""


class InputError(LanpoError):
    """Bad user input: malformed files, unknown ids, wrong dimensions, text Postgres cannot hold."""


class ReaderUnavailable(LanpoError):
    """User SQL cannot run: the read-only role is missing, refuses the login, or is not read-only after all."""


class ServingRoleUnavailable(LanpoError):
    """`lanpo serve` cannot run its SQL: the serving role is missing, refuses the login, or is privileged."""


class Terminated(BaseException):
    """SIGTERM (`kill`, a scheduler stopping the job), raised in the main thread like Ctrl-C's KeyboardInterrupt,
    so that the same cleanup runs: the run is marked failed, open transactions roll back, vLLM engines shut down."""


def _raise_terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM does not cut the cleanup short
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated in the main thread (Python's default would exit without any
    cleanup): `lanpo`'s commands, and each run of `lanpo experiment` in its worker process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
