"""`open_store` (the Python API's open, lanpo.feedback): an empty database is migrated to the head revision; a
database at an older revision, or holding tables of its own, is left alone with the `lanpo db upgrade` error."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from lanpo.db import migrate
from lanpo.db.connection import current_revision, make_db, open_store
from lanpo.errors import NotMigrated
from tests.fresh_store import fresh_store


def test_an_empty_database_is_migrated_and_an_older_one_is_not(pg_url: str, tmp_path: Path) -> None:
    with fresh_store(pg_url, tmp_path / "home") as env:
        url = env["LANPO_DATABASE_URL"]
        db = open_store(url)
        assert current_revision(db) == migrate.head_revision()
        migrate.downgrade(db, "-1")
        older = current_revision(db)
        with pytest.raises(NotMigrated, match=f"is at revision {older}") as raised:
            open_store(url)
        assert raised.value.hint == "run `lanpo db upgrade`" and current_revision(db) == older
        db.dispose()


def test_a_database_with_other_tables_is_not_migrated(pg_url: str, tmp_path: Path) -> None:
    with fresh_store(pg_url, tmp_path / "home") as env:
        url = env["LANPO_DATABASE_URL"]
        theirs = make_db(url)
        with theirs.begin() as conn:
            conn.execute(sa.text("CREATE TABLE their_orders (id int)"))
        with pytest.raises(NotMigrated, match="has no lanpo schema"):
            open_store(url)
        assert current_revision(theirs) is None
        theirs.dispose()
