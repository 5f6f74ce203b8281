"""User-facing errors: every one says what went wrong and what to do about it."""

from __future__ import annotations


class LanpoError(Exception):
    """An error the CLI prints without a traceback: `message`, then `hint` (what to do)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


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
