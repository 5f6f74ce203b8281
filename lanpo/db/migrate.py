"""Alembic, driven from lanpo: `lanpo db upgrade | downgrade | current | history` and the tests use these."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy.engine import Engine

from lanpo.db.requirements import ensure_pgvector
from lanpo.errors import InputError
from lanpo.resources import project_dir


def migrations_dir() -> Path:
    """`migrations/` of a source checkout, or the copy packed into the wheel."""
    found = project_dir("migrations", "env.py")
    if found is None:
        raise FileNotFoundError("lanpo's migrations/ folder is missing from this installation")
    return found


def alembic_config(db: Engine | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if db is not None:
        config.set_main_option("sqlalchemy.url", db.url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head() or ""


def revisions() -> list[tuple[str, str]]:
    """Every migration oldest first, as (revision id, what it does): what `lanpo db history` prints."""
    script = ScriptDirectory.from_config(alembic_config())
    return [(r.revision, r.doc or "") for r in reversed(list(script.walk_revisions()))]


def _migrate(db: Engine, revision: str, direction: str) -> None:
    """Run Alembic's upgrade or downgrade in one transaction; a target it cannot reach is an InputError."""
    with db.begin() as connection:
        config = alembic_config(db)
        config.attributes["connection"] = connection
        if direction == "upgrade":
            ensure_pgvector(connection)  # before any DDL: the server and its pgvector are ones lanpo can run on
        try:
            getattr(command, direction)(config, revision)
        except (CommandError, RevisionError) as exc:  # raised while resolving the target, before any DDL ran
            inspector = sa.inspect(connection)
            current = (
                connection.scalar(sa.text("SELECT version_num FROM alembic_version"))
                if inspector.has_table("alembic_version")
                else None
            )
            raise InputError(
                f"cannot {direction} to revision {revision!r}: {exc}",
                hint=f"the database is at {current or 'base (empty)'}; `lanpo db history` lists the revisions; "
                "or give base, head, or a relative step such as -1",
            ) from exc


def upgrade(db: Engine, revision: str = "head") -> None:
    _migrate(db, revision, "upgrade")


def downgrade(db: Engine, revision: str) -> None:
    _migrate(db, revision, "downgrade")
