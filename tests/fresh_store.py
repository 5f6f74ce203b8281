"""A fresh store for a command run as a new user runs it: an empty `LANPO_HOME` and an empty database (a new one on
the test session's server, dropped afterwards), so the command finds no lanpo schema and must create it itself."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.conftest import reader_roles


@contextmanager
def fresh_store(pg_url: str, home: Path) -> Iterator[dict[str, str]]:
    """The environment of a new user: `home` as LANPO_HOME, LANPO_DATABASE_URL an empty database."""
    name = f"lanpo_fresh_{secrets.token_hex(4)}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    home.mkdir(parents=True, exist_ok=True)
    try:
        yield {**os.environ, "LANPO_HOME": str(home), "LANPO_DATABASE_URL": url, "HF_HUB_OFFLINE": "1"}
    finally:
        readers = reader_roles(url)  # migration 0004's and 0014's roles are cluster-wide: they outlive the database
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            for role in readers:
                conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()
