"""`lanpo.cli.main`, the net under every command: what each kind of failure prints and its exit status.

Bad input, configuration and environment (LanpoError, click's usage errors, database / driver / Alembic
errors, OS errors): `error:` + `hint:`, exit 2. Anything else is a bug: `error: internal error: ...`, exit 1.
Interrupted: exit 130. The traceback appears only with -vv (given before the command, as every group option).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.util import CommandError

from lanpo.cli import main, verbosity
from lanpo.db.repo import checks, problems

STATS = ("pool", "stats", "--dataset", "d")  # reaches problems.known_datasets, where failures are injected


@pytest.mark.parametrize(
    ("argv", "count"),
    [
        ([], 0),
        (["-v", "pool", "stats"], 1),
        (["-vv", "pool"], 2),
        (["-v", "--verbose", "db"], 2),
        (["-vvv"], 3),
        (["pool", "-vv"], 0),  # after the command: not the group's option
        (["-vx", "pool"], 0),
    ],
)
def test_verbosity_is_read_before_click_parses(argv: list[str], count: int) -> None:
    assert verbosity(argv) == count


def fail_with(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise exc

    monkeypatch.setattr(problems, "known_datasets", boom)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("error: ", "  hint: "))]


DATABASE_ERRORS = [
    (sa.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("server closed the connection")), "connection"),
    (
        sa.exc.DataError("SELECT 1", {}, psycopg.errors.NumericValueOutOfRange("bigint out of range")),
        "refused a value",
    ),
    (sa.exc.IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")), "refused the change"),
    (sa.exc.ProgrammingError("SELECT", {}, psycopg.errors.UndefinedTable('relation "x" does not exist')), "schema"),
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), "cancelled the statement"),
    (psycopg.InterfaceError("the connection is closed"), "database error (InterfaceError)"),
    (sa.exc.ArgumentError("Could not parse SQLAlchemy URL from given URL string"), "not a database URL"),
    (sa.exc.TimeoutError("QueuePool limit reached"), "no database connection free"),
    (sa.exc.InvalidRequestError("This session is in 'prepared' state"), "database error (InvalidRequestError)"),
    (CommandError("Can't locate revision identified by 'x'"), "migration failed"),
]


@pytest.mark.parametrize(("exc", "says"), DATABASE_ERRORS, ids=[type(e).__name__ for e, _ in DATABASE_ERRORS])
def test_database_driver_and_alembic_errors_are_user_errors(
    exc: Exception, says: str, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_with(monkeypatch, exc)
    quiet = run_cli(*STATS)
    assert quiet.code == 2 and "Traceback" not in quiet.err and "[SQL:" not in quiet.err
    error, hint = lines(quiet.err)
    assert error.startswith("error: ") and says in error and hint.startswith("  hint: ")
    loud = run_cli("-vv", *STATS)
    assert loud.code == 2 and "Traceback" in loud.err and lines(loud.err) == [error, hint]


def test_a_real_database_refusal_is_said_plainly(run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "row_id", lambda value, *args, **kwargs: value)  # let the id reach Postgres
    result = run_cli("pool", "sample", "--problem", "99999999999999999999", "--mode", "intra")
    assert result.code == 2 and "Traceback" not in result.err
    assert lines(result.err)[0] == "error: the database refused a value: bigint out of range"


def test_an_unexpected_exception_is_an_internal_error(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_with(monkeypatch, ValueError("boom\nsecond line"))
    quiet = run_cli(*STATS)
    assert quiet.code == 1 and "Traceback" not in quiet.err
    assert lines(quiet.err) == [
        "error: internal error: ValueError: boom",
        "  hint: rerun with -vv for the traceback and report it",
    ]
    loud = run_cli("-vv", *STATS)
    assert loud.code == 1 and "Traceback (most recent call last)" in loud.err and "ValueError: boom" in loud.err


def test_os_errors_name_the_path(run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fail_with(monkeypatch, PermissionError(13, "Permission denied", "/some/file"))
    result = run_cli(*STATS)
    assert result.code == 2 and lines(result.err)[0] == "error: Permission denied: /some/file"


def test_interrupt_exits_130(run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fail_with(monkeypatch, KeyboardInterrupt())
    result = run_cli(*STATS)
    assert result.code == 130 and "aborted" in result.err and "Traceback" not in result.err


def test_sigterm_exits_143_and_the_previous_handler_comes_back(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal

    def terminate(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread while the command runs

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(problems, "known_datasets", terminate)
    result = run_cli(*STATS)
    assert result.code == 143 and "terminated" in result.err and "Traceback" not in result.err
    assert signal.getsignal(signal.SIGTERM) is before


def test_user_errors_show_the_traceback_only_with_vv(run_cli: Callable[..., Any]) -> None:
    quiet = run_cli("pool", "stats", "--dataset", "nosuch")
    assert quiet.code == 2 and "Traceback" not in quiet.err
    assert lines(quiet.err) == [
        "error: unknown dataset 'nosuch'",
        "  hint: import one: lanpo data import FILE --dataset NAME",
    ]
    assert "Traceback" not in run_cli("-v", "pool", "stats", "--dataset", "nosuch").err
    loud = run_cli("-vv", "pool", "stats", "--dataset", "nosuch")
    assert loud.code == 2 and "Traceback" in loud.err and loud.err.rstrip().endswith(quiet.err.rstrip())


def test_click_usage_errors_take_the_same_shape(run_cli: Callable[..., Any]) -> None:
    result = run_cli("pool", "sample", "--mode", "intra")
    assert result.code == 2 and "Usage:" not in result.err
    assert lines(result.err) == ["error: missing option '--problem'.", "  hint: see `lanpo pool sample --help`"]


def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0 and "Typical session" in capsys.readouterr().out
    assert main(["--version"]) == 0 and "lanpo" in capsys.readouterr().out
