"""Planner statistics after the bulk writes users run, through `lanpo` itself (lanpo.db.stats): when `data import`
(a file, a preset) returns, `pg_class.reltuples` of the problems it wrote is their true count. `relevance build`'s
is asserted in tests/retrieval/test_cli.py, a training step's in tests/train/test_resume.py, the demo's in
tests/test_demo.py.

Before issue 50's fix an import left reltuples at 0 over all its pages: the ANALYZE ran when the import's savepoint
was released, before its rows were visible to another connection, and its commit refreshed nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.conftest import truncate_all
from tests.db.store_helpers import planned_and_true


@pytest.fixture(autouse=True)
def _fresh_statistics(db: Engine) -> None:
    """These tests read the planner's statistics: each starts from tables as a fresh store has them (TRUNCATE resets
    the statistics, the `db` fixture's DELETE between tests does not)."""
    truncate_all(db)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _problems(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "question": f"What is {i} + {i % 7} apples?", "answer": str(i + i % 7)} for i in
            range(start, start + n)]  # fmt: skip


def test_data_import_of_a_file_leaves_the_planner_its_rows(tmp_path: Path, run_cli: Callable, db: Engine) -> None:
    result = run_cli("data", "import", _jsonl(tmp_path / "p.jsonl", _problems(2000)), "--dataset", "big")
    assert result.code == 0, result.err
    assert planned_and_true(db, "problems") == (2000.0, 2000)  # 28 pages, all sampled: exact


def test_an_import_heals_statistics_taken_while_its_rows_were_invisible(
    tmp_path: Path, run_cli: Callable, db: Engine
) -> None:
    """What the bug left in a store: ANALYZE ran while 2,000 rows were uncommitted (reltuples 0 over their pages).
    The next import, 100 rows (far from 10x the pages), sees reltuples 0 over pages and analyzes."""
    with db.connect() as writer, db.connect() as analyzer:
        with writer.begin():
            writer.execute(
                sa.text("INSERT INTO problems (dataset, external_id, question, answer) "
                        "SELECT 'old', g::text, 'What is ' || g || '?', g::text FROM generate_series(1, 2000) g")
            )  # fmt: skip
            analyzer.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE problems")
        assert planned_and_true(db, "problems") == (0.0, 2000)
    result = run_cli("data", "import", _jsonl(tmp_path / "p.jsonl", _problems(100)), "--dataset", "new")
    assert result.code == 0, result.err
    assert planned_and_true(db, "problems") == (2100.0, 2100)


def test_data_import_of_a_preset_leaves_the_planner_its_rows(tmp_path: Path, run_cli: Callable, db: Engine) -> None:
    rows = [{"problem": f"Solve ${i}x = {2 * i}$.", "answer": "2", "unique_id": f"test/algebra/{i}.json"}
            for i in range(1, 301)]  # fmt: skip
    result = run_cli("data", "import", _jsonl(tmp_path / "test.jsonl", rows), "--preset", "math500")
    assert result.code == 0, result.err
    assert planned_and_true(db, "problems") == (300.0, 300)
