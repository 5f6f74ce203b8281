"""Two data-parallel CPU ranks (torchrun + gloo) on a tiny model: one run, every problem of every step recorded
once, rank 0 alone writing; the ranks' adapters stay identical (the loop checks it each step)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.train.test_resume import RECIPE


@pytest.mark.skipif(shutil.which("torchrun") is None or shutil.which("lanpo") is None, reason="needs torchrun + lanpo")
def test_two_ranks_share_one_run(db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    config = tmp_path / "recipe.toml"
    config.write_text(
        RECIPE.format(out=tmp_path / "ckpt")
        .replace("steps = 4", "steps = 2")
        .replace("batch_size = 3", "batch_size = 2")
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    args = ["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python", "lanpo", "train"]
    proc = subprocess.run(
        [*args, "--config", str(config), "--no-progress"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with db.connect() as conn:
        steps = conn.execute(sa.text("SELECT step FROM run_steps ORDER BY step")).scalars().all()
        per_step = conn.execute(
            sa.text("SELECT step, count(*), count(DISTINCT problem_id) FROM run_attempts GROUP BY step ORDER BY step")
        ).all()
        runs = conn.execute(sa.text("SELECT count(*) FROM runs")).scalar()
    assert steps == [0, 1, 2] and runs == 1
    assert [tuple(r) for r in per_step] == [(1, 2 * 2, 2), (2, 2 * 2, 2)]
    assert "step    2" in proc.stdout and proc.stdout.count("step    1") == 1  # rank 0 alone reports
