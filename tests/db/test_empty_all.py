"""The `db` fixture's cleanup (tests/conftest.py `empty_all`): every table empty and its ids from 1 again, below, at
and above the row count past which a table is truncated instead of deleted from."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.conftest import BULK_ROWS, empty_all


@pytest.mark.parametrize("rows", [BULK_ROWS - 1, BULK_ROWS, BULK_ROWS + 1])
def test_every_table_is_emptied_and_its_ids_restart(db: Engine, rows: int) -> None:
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO problems (dataset, external_id, question, answer) "
                "SELECT 'bulk', g::text, 'q', 'a' FROM generate_series(1, :n) g"
            ),
            {"n": rows},
        )
        conn.execute(sa.text("INSERT INTO runs (name, kind, config) VALUES ('r', 'train', '{}')"))
    empty_all(db)
    with db.begin() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM problems")) == 0
        assert conn.scalar(sa.text("SELECT count(*) FROM runs")) == 0
        conn.execute(
            sa.text("INSERT INTO problems (dataset, external_id, question, answer) VALUES ('d', '1', 'q', 'a')")
        )
        conn.execute(sa.text("INSERT INTO runs (name, kind, config) VALUES ('r', 'train', '{}')"))
        assert conn.scalar(sa.text("SELECT id FROM problems")) == 1
        assert conn.scalar(sa.text("SELECT id FROM runs")) == 1
