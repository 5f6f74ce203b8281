"""docs/api.md's example, run as a user runs it: `python examples/api/own_loop.py` on a fresh store draws contexts
from its own earlier steps, records its groups with their rewards and lessons (and the step's metrics, the use
diagnostics among them), resumes after a SIGKILL with no step recorded twice, and reads them back with SQL."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from lanpo.diagnostics import DIAGNOSTICS
from tests.fresh_store import fresh_store

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_example_runs_on_a_fresh_store_and_resumes_after_a_kill(pg_url: str, tmp_path: Path) -> None:
    """`own_loop.py --steps 3 --out DIR`, SIGKILLed once it reports step 2, then rerun with `--resume`: the store API
    reopens the run after its last checkpointed step (rolling back what the killed step wrote), and every step is
    recorded once, its checkpoint named, the later steps drawing on the earlier ones."""
    out = tmp_path / "ckpt"
    with fresh_store(pg_url, tmp_path / "home") as env:
        example = [sys.executable, str(ROOT / "examples/api/own_loop.py"), "--steps", "3", "--out", str(out)]
        killed = subprocess.Popen(example, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert killed.stdout is not None
        for line in killed.stdout:
            if line.startswith("step 2:"):
                killed.send_signal(signal.SIGKILL)  # in step 3, or just after it: either way nothing is lost
                break
        assert killed.wait(timeout=120) == -signal.SIGKILL
        done = subprocess.run([*example, "--resume"], env=env, capture_output=True, text=True, timeout=300)
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
            steps = conn.execute(sa.text("SELECT step, checkpoint FROM run_steps ORDER BY step")).all()
            lessons = conn.scalar(sa.text("SELECT count(*) FROM experiences"))
            status = conn.scalar(sa.text("SELECT status FROM runs WHERE name = 'own-loop'"))
            uses = conn.execute(  # the use diagnostics every trainer records through the store API
                sa.text("SELECT step, mode, diagnostic, value FROM use_diagnostics WHERE run_name = 'own-loop'")
            ).all()
        db.dispose()
    assert [s for s, _ in steps] == [1, 2, 3] and all(c == str(out / f"step-{s}.pt") for s, c in steps)
    resumed = [line for line in done.stdout.splitlines() if line.startswith("resuming after step")]
    assert resumed and resumed[0].split()[3] in ("2", "3"), done.stdout
    assert sorted(g.step for g in groups) == [s for s in (1, 2, 3) for _ in range(4)]  # each step once
    assert all(g.contexts == 0 for g in groups if g.mode == "zero_shot")
    assert {g.mode for g in groups if g.step == 2} == {"intra", "inter"}  # step 2 reads step 1's attempts and lessons
    assert all(g.contexts > 0 for g in groups if g.mode != "zero_shot")
    assert lessons > 0 and status == "finished"
    diagnosed = {(u.step, u.mode, u.diagnostic) for u in uses}
    assert {(2, m, d) for m in ("intra", "inter") for d in DIAGNOSTICS} <= diagnosed, sorted(diagnosed)
    assert (1, "zero_shot", "answer_only") in diagnosed  # step 1: no context yet, every prompt zero-shot
    assert all(0.0 <= u.value <= 1.0 for u in uses)
    assert "step 2 intra:" in done.stdout and "step 2 inter:" in done.stdout  # what the example's SQL read back


def test_the_lesson_life_example_shows_version_2_and_its_uses(pg_url: str, tmp_path: Path) -> None:
    """examples/api/lesson_life.py on a fresh store: the paraphrase of step 2 becomes version 2 of step 1's lesson
    (cosine about 0.97 under all-MiniLM-L6-v2), and `lanpo pool history` shows each version's use: version 1
    helped (problem B right 2/2 with it, 0/2 zero-shot), version 2 even (1/2 both ways)."""
    with fresh_store(pg_url, tmp_path / "home") as env:
        example = [sys.executable, str(ROOT / "examples/api/lesson_life.py")]
        done = subprocess.run(example, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "step 2: modes ['inter', 'zero_shot', 'zero_shot']; 0 lesson(s) added, 1 merged" in lines
    table = lines[lines.index("$ lanpo pool history 1") + 1 :]
    assert table[:2] == ["lesson 1: pool lesson-life, problem 1, kind summary, 2 version(s)", "state: active"]
    first, second = (row.split() for row in table[3:5])
    assert first[:2] == ["1", "new"] and first[6:12] == ["1", "1", "0", "0", "0", "+1.000"]
    assert second[:2] == ["*2", "merge:newer"] and 0.95 < float(second[2]) < 0.99
    assert second[6:12] == ["1", "0", "0", "1", "0", "+0.000"]
