"""The checkpoint cadence's resume invariant, on a real store: rolling back to a checkpointed step c deletes the
rows of the committed steps after it and makes active again what they evicted, so the pool is the one step c left."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.attempts import record_groups
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.train.config import CheckpointConfig
from tests.db.store_helpers import group, make_pool, make_problems
from tests.train.test_resume import RECIPE
from tests.train.trainer_process import launch

SHA = "ab" * 32


def _pool(session: Session, pool_id: int) -> list[tuple]:
    sql = "SELECT id, evicted_at IS NULL, evicted_by FROM experiences WHERE pool_id = :p ORDER BY id"
    return [tuple(r) for r in session.execute(sa.text(sql), {"p": pool_id})]


def _step(session: Session, run_id: int, pool, problem: int, step: int, checkpoint: bool) -> None:
    pv = steps_repo.add_policy_version(session, run_id, step, SHA)
    record_groups(session, [group(problem, ["a", "b"], run_id=run_id, step=step, policy_version_id=pv)])
    add_experiences(session, pool, [NewExperience(problem, f"lesson {step}", 1.0, run_id=run_id, step=step)])
    runs_repo.record_metrics(session, run_id, step, {"reward/mean": 0.5})
    steps_repo.commit_step(session, run_id, step, pv, f"/ckpt/step-{step}" if checkpoint else None)


def test_rollback_to_the_checkpoint_restores_the_pool_and_undoes_later_evictions(session: Session) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "cadence", StoreConfig(per_problem_cap=1, per_step_cap=1))  # each lesson evicts
    run = runs_repo.create_run(session, "cadence", "train", {}, pool_id=pool.id).id
    for step in (1, 2):
        _step(session, run, pool, problem, step, checkpoint=step == 2)
    after_c = _pool(session, pool.id)
    for step in (3, 4):  # committed, no checkpoint: a crash here resumes from step 2
        _step(session, run, pool, problem, step, checkpoint=False)
    assert _pool(session, pool.id) != after_c
    assert steps_repo.last_checkpointed_step(session, run) == 2

    rolled = steps_repo.rollback_uncommitted(session, run, 2)
    assert _pool(session, pool.id) == after_c  # step 2's lesson active again, steps 3-4's gone
    assert (rolled.attempts, rolled.experiences, rolled.evictions, rolled.steps) == (4, 2, 1, 2)
    assert (
        rolled.line(2, 4)
        == "resumed from step 2; rolled back steps 3..4: 4 attempts, 2 experiences, 1 evictions undone"
    )
    rows = session.execute(sa.text("SELECT step FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": run})
    assert [r[0] for r in rows] == [1, 2]
    metrics = session.execute(sa.text("SELECT DISTINCT step FROM run_metrics WHERE run_id = :r"), {"r": run})
    assert sorted(r[0] for r in metrics) == [1, 2]


def test_cadence_checkpoints_every_k_steps_and_the_last() -> None:
    cadence = CheckpointConfig(every=3)
    assert [s for s in range(1, 8) if cadence.due(s, 7)] == [3, 6, 7]


def test_keep_checkpoints_reads_as_checkpoint_keep(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    from lanpo.train.config import load_config

    recipe = tmp_path / "r.toml"
    recipe.write_text("keep_checkpoints = 3\n")
    cfg = load_config(recipe)
    assert cfg.checkpoint.keep == 3 and cfg.checkpoint.every == 1
    assert "keep_checkpoints is deprecated: read as checkpoint.keep" in caplog.text


# --------------------------------------------------------------------------- SIGKILLs at random moments

KILLED_RECIPE = """
base = "resume.toml"  # tests/train/test_resume.py's recipe: the tiny model, intra + inter feedback, lessons admitted
run_name = "cadence-kill"
steps = 6

[checkpoint]
every = 3

[store]
per_problem_cap = 1  # each problem keeps one lesson: every later lesson of it evicts, from step 2 on
per_step_cap = 3

[summarizer]
max_new_per_step = 3
"""


def _committed(db: Engine, since: float = 0.0) -> list[tuple[int, bool, float]]:
    """The run's committed steps (committed after epoch `since`): (step, checkpointed, committed_at, epoch s)."""
    sql = (
        "SELECT step, checkpoint IS NOT NULL, extract(epoch FROM committed_at) FROM run_steps "
        "WHERE committed_at > to_timestamp(:since) ORDER BY step"
    )
    with db.connect() as conn:
        return [(int(s), bool(c), float(t)) for s, c, t in conn.execute(sa.text(sql), {"since": since})]


def _now(db: Engine) -> float:
    with db.connect() as conn:
        return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())


def _drain(proc: subprocess.Popen[str]) -> list[str]:
    """Read the trainer's stderr in the background (a full pipe would stall it); the lines so far."""
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        lines.extend(proc.stderr)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _kill_at_random(
    db: Engine, config: Path, resume: bool, rng: random.Random, every: int, steps: int
) -> tuple[int, int, list[str]]:
    """Start (or resume) the trainer and SIGKILL it at a random moment: a random fraction into the step after a
    random step it commits that is no checkpoint, so the store holds committed steps past the last checkpoint
    (from a late checkpoint with no such step left: a random moment of its first second). Returns (last
    checkpointed, last committed) step at the kill, and its stderr."""
    before = _committed(db)
    resumes_from = max((s for s, c, _ in before if c), default=0)  # what the resume rolls back to
    targets = [s for s in range(resumes_from + 1, steps - 1) if s % every != 0]
    target = rng.choice(targets) if targets else None
    fraction = rng.random()
    since = _now(db)
    proc = launch(config, None, resume=resume)
    lines = _drain(proc)
    deadline = time.monotonic() + 240
    step_s = 1.0
    if target is not None:
        while not any(s >= target for s, _, _ in _committed(db, since)):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.02)
        times = [t for _, _, t in _committed(db, since)]
        step_s = max(times[-1] - times[-2], 0.05) if len(times) > 1 else 0.5
    time.sleep(fraction * 0.9 * step_s)  # inside step target + 1: its generation, update, checkpoint or commit
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    committed = _committed(db)
    print(f"killed {fraction:.2f} x {step_s:.2f} s after step {target} committed; last committed {committed[-1][0]}")
    return max(s for s, c, _ in committed if c), committed[-1][0], lines


def test_random_sigkills_resume_from_the_checkpoint_with_the_pool_it_left(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """Two SIGKILLs at seeded random moments of a run that checkpoints every 3 steps and evicts from step 2 on, the
    second of a resumed run; each resume rolls the store back to the last checkpoint. At the end: every step committed
    once with its batch x n attempts, each step drew its lessons from the pool as the step before left it (created by
    then, not evicted by then), and every eviction and every experience belongs to the committed step that made it.
    The first kill comes after step 1, 2 or 4 has committed, none a checkpoint, so a rollback is exercised (asserted
    below); a third kill was one more random moment, and a fourth trainer start (~8 s)."""
    seed = random.SystemRandom().randrange(2**32)
    print(f"seed {seed} (random.Random)")
    rng = random.Random(seed)
    steps, every, batch, n = 6, 3, 3, 2
    (tmp_path / "resume.toml").write_text(RECIPE.format(out=tmp_path / "ckpt"))
    config = tmp_path / "recipe.toml"
    config.write_text(KILLED_RECIPE)

    kills = [_kill_at_random(db, config, attempt > 0, rng, every, steps) for attempt in range(2)]
    assert any(committed > checkpointed for checkpointed, committed, _ in kills), [k[:2] for k in kills]
    for (checkpointed, committed, _), (_, _, err) in itertools.pairwise(kills):  # each resume says what it rolled back
        if committed > checkpointed:
            assert f"resumed from step {checkpointed}; rolled back step" in "".join(err), "".join(err)[-3000:]
    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    if kills[-1][1] > kills[-1][0]:
        assert f"resumed from step {kills[-1][0]}; rolled back step" in err, err[-3000:]

    def rows(sql: str) -> list[tuple]:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql))]

    assert [s for s, _, _ in _committed(db)] == list(range(steps + 1))
    assert rows("SELECT step, count(*) FROM run_attempts GROUP BY step ORDER BY step") == [
        (s, batch * n) for s in range(1, steps + 1)
    ]
    assert rows("SELECT step, count(*) FROM rollout_groups GROUP BY step ORDER BY step") == [
        (s, batch) for s in range(1, steps + 1)
    ]
    assert rows("SELECT status FROM runs") == [("finished",)]
    # the pool evicted, and steps drew lessons from it: the check below is not vacuous
    assert rows("SELECT count(*) > 0 FROM experiences WHERE evicted_step IS NOT NULL") == [(True,)]
    assert rows("SELECT count(*) > 0 FROM group_contexts WHERE experience_version_id IS NOT NULL") == [(True,)]
    # each experience and each eviction was made in the transaction of the committed step it names (now() is the
    # transaction's start): an eviction left over from a rolled-back step would carry that step's older time
    assert rows(
        "SELECT count(*) FROM experiences e LEFT JOIN run_steps s ON s.run_id = e.run_id AND s.step = e.step "
        "WHERE s.committed_at IS DISTINCT FROM e.created_at"
    ) == [(0,)]
    assert (
        rows(
            "SELECT e.id, e.evicted_step FROM experiences e LEFT JOIN run_steps s "
            "ON s.run_id = e.evicted_run_id AND s.step = e.evicted_step "
            "WHERE e.evicted_at IS NOT NULL AND s.committed_at IS DISTINCT FROM e.evicted_at"
        )
        == []
    )
    # the pool after each step s: created at a step <= s, not evicted by a step <= s; with per_problem_cap = 1 and
    # oldest-first eviction that is each problem's newest lesson of steps <= s, and step s + 1 drew only from it
    visible = "SELECT e.id FROM experiences e WHERE e.step <= {s} AND (e.evicted_step IS NULL OR e.evicted_step > {s})"
    newest = "SELECT DISTINCT ON (problem_id) id FROM experiences WHERE step <= {s} ORDER BY problem_id, id DESC"
    for s in range(steps + 1):
        assert sorted(rows(visible.format(s=s))) == sorted(rows(newest.format(s=s))), f"pool after step {s}"
        drawn_outside = rows(
            "SELECT v.experience_id FROM group_contexts c JOIN rollout_groups g ON g.id = c.group_id "
            "JOIN experience_versions v ON v.id = c.experience_version_id "
            f"WHERE g.step = {s + 1} AND v.experience_id NOT IN ({visible.format(s=s)})"
        )
        assert drawn_outside == [], f"step {s + 1} drew lessons the pool after step {s} did not hold"
