"""docs/api.md's example, run as a user runs it: `python examples/api/own_loop.py` on a fresh store draws contexts
from its own earlier steps, records its groups with their rewards and lessons (and the step's metrics, the use
diagnostics among them), and reads them back with SQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from lanpo.diagnostics import DIAGNOSTICS
from tests.fresh_store import fresh_store

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_example_runs_on_a_fresh_store(pg_url: str, tmp_path: Path) -> None:
    with fresh_store(pg_url, tmp_path / "home") as env:
        example = [sys.executable, str(ROOT / "examples/api/own_loop.py")]
        done = subprocess.run(example, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        db = sa.create_engine(env["LANPO_DATABASE_URL"], poolclass=sa.pool.NullPool)
        with db.connect() as conn:
            groups = conn.execute(
                sa.text(
                    "SELECT g.step, g.mode, count(c.*) AS contexts FROM rollout_groups g "
                    "JOIN runs r ON r.id = g.run_id LEFT JOIN group_contexts c ON c.group_id = g.id "
                    "WHERE r.name = 'own-loop' GROUP BY g.id"
                )
            ).all()
            lessons = conn.scalar(sa.text("SELECT count(*) FROM experiences"))
            status = conn.scalar(sa.text("SELECT status FROM runs WHERE name = 'own-loop'"))
            uses = conn.execute(  # the use diagnostics every trainer records through the store API
                sa.text("SELECT step, mode, diagnostic, value FROM use_diagnostics WHERE run_name = 'own-loop'")
            ).all()
        db.dispose()
    assert {g.step for g in groups} == {1, 2} and len(groups) == 8
    assert all(g.contexts == 0 for g in groups if g.mode == "zero_shot")
    assert {g.mode for g in groups if g.step == 2} == {"intra", "inter"}  # step 2 reads step 1's attempts and lessons
    assert all(g.contexts > 0 for g in groups if g.mode != "zero_shot")
    assert lessons > 0 and status == "finished"
    diagnosed = {(u.step, u.mode, u.diagnostic) for u in uses}
    assert {(2, m, d) for m in ("intra", "inter") for d in DIAGNOSTICS} <= diagnosed, sorted(diagnosed)
    assert (1, "zero_shot", "answer_only") in diagnosed  # step 1: no context yet, every prompt zero-shot
    assert all(0.0 <= u.value <= 1.0 for u in uses)
    assert "step 2 intra:" in done.stdout and "step 2 inter:" in done.stdout  # what the example's SQL read back
