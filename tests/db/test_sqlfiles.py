"""sql/ is read as one snapshot: a statement edited after a process's first read of any is not the one it runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lanpo.db import sqlfiles


@pytest.fixture
def sql_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A two-statement sql/ of its own; the process's real snapshot is dropped before and after."""
    (tmp_path / "queries").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "queries" / "first.sql").write_text("SELECT 1")
    (tmp_path / "queries" / "later.sql").write_text("SELECT :old")
    (tmp_path / "recipes" / "one.sql").write_text("SELECT 2")
    monkeypatch.setattr(sqlfiles, "sql_dir", lambda: tmp_path)
    sqlfiles._texts.cache_clear()
    sqlfiles.load.cache_clear()
    yield tmp_path
    sqlfiles._texts.cache_clear()
    sqlfiles.load.cache_clear()


def test_a_statement_edited_after_the_first_read_is_run_as_it_was(sql_copy: Path) -> None:
    assert sqlfiles.text_of("queries/first") == "SELECT 1"
    (sql_copy / "queries" / "later.sql").write_text("SELECT :new")  # a `git pull` under a running trainer
    (sql_copy / "queries" / "added.sql").write_text("SELECT 3")
    assert sqlfiles.text_of("queries/later") == "SELECT :old"
    assert list(sqlfiles.load("queries/later").compile().params) == ["old"]
    assert sqlfiles.names("queries") == ["queries/first", "queries/later"]
    assert sqlfiles.names("recipes") == ["recipes/one"]
    with pytest.raises(FileNotFoundError, match=r"queries/added\.sql"):
        sqlfiles.text_of("queries/added")


def test_the_real_snapshot_holds_every_file_of_sql() -> None:
    root = sqlfiles.sql_dir()
    on_disk = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.sql"))
    assert sorted(sqlfiles._texts()) == on_disk and len(on_disk) > 100
    assert sqlfiles.text_of("queries/sample_intra") == (root / "queries" / "sample_intra.sql").read_text()
