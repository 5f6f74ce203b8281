"""Migration 0009's lanpo_draw_key: bit for bit the key the sample_*.sql copies computed, inlined by the planner,
executable by the read-only role, and gone after a downgrade and back after the upgrade."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db import migrate
from lanpo.db.reader import stored_reader
from lanpo.db.readonly import query_readonly

# The expression each of sample_intra / sample_inter / sample_inter_unfiltered.sql held before 0009, kept here as
# the reference the function must equal.
OLD_KEY = """
-ln((CAST(CAST(CAST('x' || left(encode(
        sha256(convert_to(concat_ws('/', candidate_id, problem_id, CAST(:seed AS bigint)), 'UTF8')),
    'hex'), 13) AS bit(52)) AS bigint) AS float8) + 0.5) / 4503599627370496.0) * (rank + 1)
"""

GRID = """
SELECT c AS candidate_id, p AS problem_id, r AS rank
FROM unnest(CAST(ARRAY[1, 2, 3, 999, 1000, 123456789, 9223372036854775807] AS bigint[])) c,
     unnest(CAST(ARRAY[1, 7, 42, 100000] AS bigint[])) p,
     generate_series(CAST(0 AS bigint), 31) r
"""

SEEDS = (0, 1, 7, -1, 2**63 - 1, -(2**63))
SIGNATURE = "lanpo_draw_key(bigint, bigint, bigint, bigint)"


def test_the_function_equals_the_old_expression(db: Engine) -> None:
    with db.connect() as conn:
        for seed in SEEDS:
            rows = conn.execute(
                sa.text(
                    f"SELECT {OLD_KEY} AS old, lanpo_draw_key(:seed, candidate_id, problem_id, rank) AS new "
                    f"FROM ({GRID}) g"
                ),
                {"seed": seed},
            ).all()
            assert len(rows) == 7 * 4 * 32
            assert all(old == new for old, new in rows)  # exact, not approximate: draws must not move


def test_the_planner_inlines_it(db: Engine) -> None:
    with db.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT provolatile, proparallel, (SELECT lanname FROM pg_language WHERE oid = prolang) = 'sql', "
                "proisstrict FROM pg_proc WHERE oid = CAST(:signature AS regprocedure)"
            ),
            {"signature": SIGNATURE},
        ).one()
        assert tuple(row) == ("i", "s", True, False)
        plan = "\n".join(
            conn.scalars(
                sa.text(f"EXPLAIN (VERBOSE) SELECT lanpo_draw_key(7, candidate_id, problem_id, rank) FROM ({GRID}) g")
            )
        )
    assert "sha256" in plan and "lanpo_draw_key" not in plan


def test_the_reader_executes_it(db: Engine) -> None:
    role = stored_reader(db).role
    with db.connect() as conn:
        assert conn.scalar(
            sa.text("SELECT has_function_privilege(:r, :signature, 'EXECUTE')"),
            {"r": role, "signature": SIGNATURE},
        )
        expected = conn.scalar(sa.text("SELECT lanpo_draw_key(7, 3, 5, 0)"))
    assert query_readonly(db, "SELECT lanpo_draw_key(7, 3, 5, 0)").rows == [(expected,)]


def test_downgrade_drops_it_and_upgrade_brings_it_back(db: Engine) -> None:
    exists = "SELECT count(*) FROM pg_proc WHERE proname = 'lanpo_draw_key'"
    with db.connect() as conn:
        before = conn.scalar(sa.text("SELECT lanpo_draw_key(-1, 10, 20, 3)"))
    migrate.downgrade(db, "0008")
    try:
        with db.connect() as conn:
            assert conn.scalar(sa.text(exists)) == 0
    finally:
        migrate.upgrade(db)
    with db.connect() as conn:
        assert conn.scalar(sa.text(exists)) == 1
        assert conn.scalar(sa.text("SELECT lanpo_draw_key(-1, 10, 20, 3)")) == before
    assert query_readonly(db, "SELECT lanpo_draw_key(-1, 10, 20, 3)").rows == [(before,)]
