"""Database, driver and Alembic exceptions, said as user-facing errors (`error:` + `hint:`) by the CLI.

Input a command can check, it checks before it reaches the database (`InputError` with its own hint). This is
the net under that: whatever SQLAlchemy, psycopg or Alembic still raises becomes one line saying what the
database refused, and a hint. A transaction that failed was rolled back (`lanpo.db.connection.transaction`).
"""

from __future__ import annotations

import sys

from lanpo.errors import LanpoError

ROLLED_BACK = "the failing transaction was rolled back; rerun with -vv for the traceback"


def _one_line(text: object) -> str:
    return "; ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def _driver_error(exc: BaseException) -> LanpoError | None:
    """A psycopg error (raised directly or wrapped by SQLAlchemy as `.orig`)."""
    import psycopg

    what = _one_line(exc)
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        return LanpoError(f"the database schema does not match this lanpo: {what}", hint="run `lanpo db upgrade`")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return LanpoError(f"the database cancelled the statement: {what}", hint=ROLLED_BACK)
    if isinstance(exc, psycopg.OperationalError):
        return LanpoError(
            f"the database connection failed: {what}",
            hint="check that the server runs (`lanpo db status`) and LANPO_DATABASE_URL; rerun with -vv for details",
        )
    if isinstance(exc, psycopg.DataError):
        return LanpoError(
            f"the database refused a value: {what}",
            hint="a number or text is out of range for its column; " + ROLLED_BACK,
        )
    if isinstance(exc, psycopg.IntegrityError):
        return LanpoError(f"the database refused the change: {what}", hint=ROLLED_BACK)
    if isinstance(exc, psycopg.Error):
        return LanpoError(f"database error ({type(exc).__name__}): {what}", hint=ROLLED_BACK)
    return None


def as_user_error(exc: BaseException) -> LanpoError | None:
    """`exc` as a LanpoError when it comes from the database, the driver or Alembic; None for anything else."""
    modules = sys.modules
    if "alembic" in modules:
        from alembic.script.revision import RevisionError
        from alembic.util import CommandError

        if isinstance(exc, CommandError | RevisionError):
            return LanpoError(
                f"migration failed: {_one_line(exc)}",
                hint="`lanpo db current` shows the schema's revision; `lanpo db upgrade` migrates to the newest",
            )
    if "psycopg" in modules:
        found = _driver_error(exc)
        if found is not None:
            return found
    if "sqlalchemy" in modules:
        import sqlalchemy.exc as sa_exc

        if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None and "psycopg" in modules:
            found = _driver_error(exc.orig)
            if found is not None:
                return found
        if isinstance(exc, sa_exc.ArgumentError) and "URL" in str(exc):
            return LanpoError(
                f"not a database URL: {_one_line(exc)}",
                hint="LANPO_DATABASE_URL looks like postgresql://user:pass@host:5432/dbname",
            )
        if isinstance(exc, sa_exc.TimeoutError):
            return LanpoError(f"no database connection free: {_one_line(exc)}", hint="retry, or raise the pool size")
        if isinstance(exc, sa_exc.StatementError):  # its text carries the whole SQL statement: say the cause only
            cause = exc.orig if exc.orig is not None else exc.args[0]
            return LanpoError(f"database error ({type(exc).__name__}): {_one_line(cause)}", hint=ROLLED_BACK)
        if isinstance(exc, sa_exc.SQLAlchemyError):
            return LanpoError(f"database error ({type(exc).__name__}): {_one_line(exc)}", hint=ROLLED_BACK)
    return None
