"""Asynchronous GRPO through the store: a trainer and `lanpo worker` processes on one queue, with real signals.

- At `workers.max_staleness = 0` with one worker, a run is the synchronous run: same rollouts, same metrics.
- A worker SIGKILLed in the middle of a claim loses nothing: the claim is redone by another worker, every step is
  trained once, on one result.
- A worker that cannot serve a run says why in one line and claims nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.engine import ENV_URL
from lanpo.train.config import CheckpointConfig, GRPOConfig, WorkersConfig
from lanpo.train.loop import TrainResult, train
from lanpo.train.plumbing.pause import PAUSE_ENV
from lanpo.train.plumbing.staged import STAGED_DIR
from tests.conftest import truncate_all
from tests.train.conftest import insert_toy_problems, tiny_config
from tests.train.test_resume import RECIPE

TIMING = ("time/", "async/")  # seconds differ run to run; async/* exist only in the asynchronous run


def _rows(db: Engine, sql: str, **params: Any) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def _responses(db: Engine, run_id: int) -> list[tuple[int, int, str, str]]:
    return [
        tuple(r)
        for r in _rows(
            db,
            "SELECT g.step, g.problem_id, g.prompt, a.response FROM rollout_groups g "
            "JOIN attempts a ON a.group_id = g.id WHERE g.run_id = :r ORDER BY g.step, g.id, a.id",
            r=run_id,
        )
    ]


def _worker(url: str, run_name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lanpo", "worker", "--run", run_name, *args],
        env={**os.environ, ENV_URL: url, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_one_worker_at_staleness_0_is_the_synchronous_run(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    """The asynchronous run checkpoints at step 3 alone (`checkpoint.every = 3`): its worker serves steps 2 and 3
    from the weights of steps 1 and 2 that the trainer staged for it, and they are the synchronous run's."""
    hashes = "SELECT step, adapter_sha256 FROM policy_versions WHERE run_id = :r ORDER BY step"
    # the synchronous run first, on a store it alone wrote; then the store is emptied (ids restart), so the
    # asynchronous run draws its contexts from a pool that is, id for id, the one the synchronous run drew from
    # (weight decay: the random model's rewards are all 0, and each version still differs from the one before)
    grpo = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, weight_decay=0.1)
    sync = train(tiny_config(tmp_path / "sync", run_name="tiny", grpo=grpo), engine=db, progress=False)
    sync_rows, sync_hashes = _responses(db, sync.run_id), _rows(db, hashes, r=sync.run_id)
    assert len({h.adapter_sha256 for h in sync_hashes}) == 4
    truncate_all(db)
    assert insert_toy_problems(db) == toy_problems
    cfg = tiny_config(
        tmp_path / "async", run_name="tiny", workers=WorkersConfig(count=1, lease_s=30),
        checkpoint=CheckpointConfig(every=3), grpo=grpo,
    )  # fmt: skip
    split = train(cfg, engine=db, progress=False)
    assert split.steps == sync.steps == [1, 2, 3]
    assert _responses(db, split.run_id) == sync_rows  # every prompt, context and response
    for step, (a, s) in enumerate(zip(split.metrics, sync.metrics, strict=True), start=1):
        same = {k: v for k, v in s.items() if not k.startswith(TIMING)}
        assert {k: v for k, v in a.items() if not k.startswith(TIMING)} == same, f"step {step}"
        assert a["async/staleness"] == 0 and a["async/dropped"] == 0 and a["async/redone"] == 0
    assert _rows(db, hashes, r=split.run_id) == sync_hashes  # the same weights, step by step
    # every queued step was generated once, by the policy of the step before, and used by the commit of its step
    work = _rows(
        db,
        "SELECT w.step, w.status, w.claims, r.policy_step FROM rollout_work w JOIN rollout_results r "
        "ON r.work_id = w.id WHERE w.run_id = :r ORDER BY w.step",
        r=split.run_id,
    )
    assert [tuple(w) for w in work] == [(s, "used", 1, s - 1) for s in (1, 2, 3)]
    assert (split.checkpoint_dir / "workers" / "worker-0.log").is_file()
    # steps 1 and 2 are in no checkpoint: the worker read them from the staged weights, and what it served is the
    # version the store records for every rollout
    steps = _rows(db, "SELECT step, checkpoint IS NOT NULL AS saved FROM run_steps WHERE run_id = :r ORDER BY step",
                  r=split.run_id)  # fmt: skip
    assert [tuple(s) for s in steps] == [(0, True), (1, False), (2, False), (3, True)]
    assert _served_as_recorded(db, split.run_id) == 3 * 3 * 2
    # the staged versions kept: those of the newest KEEP committed steps that no checkpoint holds (step 2's)
    assert {p.name for p in (split.checkpoint_dir / STAGED_DIR).iterdir()} == {sync_hashes[2].adapter_sha256}
    _a_worker_follows_a_rollback(db, cfg, split.run_id, [h.adapter_sha256 for h in sync_hashes])


def _a_worker_follows_a_rollback(db: Engine, cfg: Any, run_id: int, hashes: list[str]) -> None:
    """A worker that outlives its trainer serves step 3; a resume rolls step 3 back and commits it again with other
    weights (those staged for step 2 stand in). The worker reloads for the same step number: it serves a version by
    its step and hash."""
    from lanpo.db.engine import transaction
    from lanpo.db.repo import queue as queue_repo
    from lanpo.db.repo import steps as steps_repo
    from lanpo.train.producer import worker as worker_mod

    prompts = _rows(db, "SELECT prompts FROM rollout_work WHERE run_id = :r AND step = 3", r=run_id)[0].prompts
    worker = worker_mod._Worker(db, run_id, cfg, 30.0)
    try:
        assert (worker.step, worker.sha256) == (3, hashes[3])  # from step 3's checkpoint
        with transaction(db) as session:  # what a resume to step 2 and a redone step 3 leave in the store
            steps_repo.rollback_uncommitted(session, run_id, 2)
            steps_repo.commit_step(session, run_id, 3, steps_repo.add_policy_version(session, run_id, 3, hashes[2]))
            queue_repo.enqueue(session, run_id, 4, prompts, 3)
        claim = worker.claim()
        assert claim is not None and worker.serve(claim)
        assert (worker.step, worker.sha256, worker.versions) == (3, hashes[2], [3, 3])  # reloaded, from staged/
        served = _rows(db, "SELECT r.policy_step, r.groups FROM rollout_results r JOIN rollout_work w "
                           "ON w.id = r.work_id WHERE w.run_id = :r AND w.step = 4", r=run_id)  # fmt: skip
        assert {c["completion"]["served_adapter_sha256"] for g in served[0].groups for c in g["rollouts"]} == {
            hashes[2]
        }
    finally:
        worker.close()


def _served_as_recorded(db: Engine, run_id: int) -> int:
    """The run's attempts, once every one is checked to carry the hash of the policy version its group records."""
    rows = _rows(
        db,
        "SELECT a.served_adapter_sha256 AS served, v.adapter_sha256 AS recorded FROM attempts a "
        "JOIN rollout_groups g ON g.id = a.group_id JOIN policy_versions v ON v.id = g.policy_version_id "
        "WHERE g.run_id = :r AND g.mode <> 'val'",
        r=run_id,
    )
    assert rows and all(r.served == r.recorded for r in rows), [tuple(r) for r in rows if r.served != r.recorded]
    return len(rows)


def _train_in_thread(cfg: Any, db: Engine) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = train(cfg, engine=db, progress=False)
        except BaseException as exc:  # reported by the test
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_worker_killed_in_its_claim_loses_nothing_and_the_claim_is_redone(
    db: Engine, db_env: str, toy_problems: list[int], tmp_path: Path
) -> None:
    cfg = tiny_config(
        tmp_path, run_name="killed", steps=3,
        workers=WorkersConfig(external=True, max_staleness=1, lease_s=3),
        grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, tis_cap=2.0),
    )  # fmt: skip
    thread, out = _train_in_thread(cfg, db)
    _wait_for(lambda: _rows(db, "SELECT 1 FROM rollout_work WHERE step = 2"), 120, "steps 1 and 2 to be queued")
    # worker A stops inside its claim of step 2, before it generates (the pause hook), and is SIGKILLed there
    first = _worker(db_env, "killed", "--max-claims", "1")  # step 1: done, then it exits
    assert first.wait(120) == 0, first.stderr.read() if first.stderr else ""
    victim = _worker(db_env, "killed", env={PAUSE_ENV: "generate:2"})
    assert victim.stderr is not None
    for line in victim.stderr:
        if "lanpo-paused generate:2" in line:
            break
    held = _rows(db, "SELECT status, claimed_by FROM rollout_work WHERE step = 2")
    assert held[0].status == "claimed" and str(victim.pid) in held[0].claimed_by
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # worker B redoes it once the lease runs out, and serves the rest of the run
    rescuer = _worker(db_env, "killed")
    thread.join(300)
    assert not thread.is_alive() and "error" not in out, out.get("error")
    result: TrainResult = out["result"]
    assert rescuer.wait(60) == 0, rescuer.stderr.read() if rescuer.stderr else ""
    assert result.steps == [1, 2, 3]
    work = _rows(
        db,
        "SELECT w.step, w.status, w.claims, w.claimed_by FROM rollout_work w WHERE w.run_id = :r ORDER BY w.step",
        r=result.run_id,
    )
    assert [(w.step, w.status) for w in work] == [(1, "used"), (2, "used"), (3, "used")]  # one result each
    assert work[1].claims == 2 and str(rescuer.pid) in work[1].claimed_by  # taken again, by the rescuer
    assert result.metrics[1]["async/redone"] == 1 and result.metrics[0]["async/redone"] == 0
    assert max(m["async/staleness"] for m in result.metrics) <= 1
    groups = _rows(db, "SELECT step, count(*) AS n FROM rollout_groups WHERE run_id = :r GROUP BY step ORDER BY step",
                   r=result.run_id)  # fmt: skip
    assert [(g.step, g.n) for g in groups] == [(1, 3), (2, 3), (3, 3)]  # nothing lost, nothing doubled


@pytest.mark.parametrize(
    ("setup", "args", "expect"),
    [
        ("none", [], "no run named 'ghost'"),
        ("finished", [], "has finished"),
        ("sync", [], "trains synchronously"),
        ("running", ["--model", "someone-else"], "trains 'tiny-random'"),
    ],
)
def test_a_worker_that_cannot_serve_the_run_refuses_and_claims_nothing(
    db: Engine, toy_problems: list[int], tmp_path: Path, run_cli: Any, setup: str, args: list[str], expect: str
) -> None:
    name = "ghost"
    cfg = tiny_config(tmp_path, run_name=name, steps=1, workers=WorkersConfig(external=setup != "sync"))
    if setup == "finished":  # an asynchronous run its worker served to the end
        _finish_with_a_worker(cfg, db)
    elif setup != "none":  # a running run (as a trainer holding it would show it), synchronous or not
        with db.begin() as conn:
            conn.execute(sa.text("INSERT INTO runs (name, kind, config, model) VALUES (:n, 'train', "
                                 "CAST(:c AS jsonb), 'tiny-random')"),
                         {"n": name, "c": _config_json(cfg)})  # fmt: skip
    before = _rows(db, "SELECT coalesce(sum(claims), 0) AS c FROM rollout_work")[0].c
    got = run_cli("worker", "--run", name, *args)
    assert got.code == 2 and expect in got.err and got.err.startswith("error:"), got.err
    assert "Traceback" not in got.err
    assert _rows(db, "SELECT coalesce(sum(claims), 0) AS c FROM rollout_work")[0].c == before


def _config_json(cfg: Any) -> str:
    import json

    from lanpo.config import to_mapping

    return json.dumps(to_mapping(cfg))


def _finish_with_a_worker(cfg: Any, db: Engine) -> None:
    from lanpo.train.producer.worker import run_worker

    thread, out = _train_in_thread(cfg, db)
    _wait_for(lambda: _rows(db, "SELECT 1 FROM rollout_work"), 120, "the step to be queued")
    run_worker(db, cfg.run_name, max_claims=1)
    thread.join(120)
    assert "result" in out, out.get("error")


def test_what_workers_refuse_at_load(tmp_path: Path) -> None:
    from lanpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"grpo\.tis_cap"):
        tiny_config(tmp_path, workers=WorkersConfig(count=1, max_staleness=1))
    with pytest.raises(ConfigError, match="no worker serves"):
        tiny_config(tmp_path, workers=WorkersConfig(max_staleness=1))
    assert WorkersConfig(external=True).enabled and WorkersConfig(count=2).enabled and not WorkersConfig().enabled
    tiny_config(tmp_path, batch_size=4, workers=WorkersConfig(count=1)).check_world(2)  # torchrun trainers too
    tiny_config(tmp_path, method="mel", workers=WorkersConfig(count=1))  # and MEL (the workers replay)
    tiny_config(tmp_path, checkpoint=CheckpointConfig(every=10), workers=WorkersConfig(count=1))  # recipes' cadence


# the resume tests' recipe (tiny model, 4 steps, 3 problems x 2 rollouts, both kinds of feedback), asynchronous
ASYNC_RECIPE = (
    RECIPE.replace("learning_rate = 1e-3\n", "learning_rate = 1e-3\ntis_cap = 2.0\n")
    + """
[workers]
count = 1
max_staleness = 1
lease_s = 3
"""
)


def test_a_killed_trainer_resumes_on_the_groups_made_meanwhile_and_its_workers_end_with_it(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    from lanpo.db.heartbeat import pid_alive
    from tests.train.trainer_process import kill_when_paused, launch

    config = tmp_path / "recipe.toml"
    config.write_text(ASYNC_RECIPE.format(out=tmp_path / "ckpt"))
    # killed inside step 2's transaction: its groups were trained on, not committed; step 3's are queued ahead
    kill_when_paused(launch(config, "db_write:2"), "db_write:2")
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,)]
    work = _rows(db, "SELECT step, status, claimed_by FROM rollout_work ORDER BY step")
    assert [(w.step, w.status) for w in work][:2] == [(1, "used"), (2, "done")]
    worker_pid = int(work[0].claimed_by.rsplit(":", 1)[1])
    _wait_for(lambda: not pid_alive(worker_pid), 30, "the dead trainer's worker to end")  # no orphan serves on

    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(s,) for s in range(5)]
    used = _rows(
        db,
        "SELECT w.step, count(*) AS n, max(w.claims) AS claims FROM rollout_work w WHERE w.status = 'used' "
        "GROUP BY w.step ORDER BY w.step",
    )
    assert [(u.step, u.n) for u in used] == [(s, 1) for s in range(1, 5)]  # every step trained on one result
    assert used[1].claims == 1  # step 2's groups, made before the crash, were trained again: not regenerated
    stale = _rows(db, "SELECT m.step, m.value FROM run_metrics m WHERE m.name = 'async/staleness' ORDER BY m.step")
    assert [s.step for s in stale] == [1, 2, 3, 4] and max(s.value for s in stale) <= 1
    assert _rows(db, "SELECT step, count(*) FROM run_attempts GROUP BY step ORDER BY step") == [
        (s, 3 * 2) for s in range(1, 5)
    ]


def test_a_trainer_killed_between_checkpoints_resumes_from_the_checkpoint_and_nothing_made_meanwhile_is_trained_on(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """`checkpoint.every = 3`, one local worker, one step queued ahead: killed inside step 3's transaction, the run
    has committed steps 1 and 2 with no checkpoint, and the worker has served staged weights. The resume rolls back to
    step 0: the work of the rolled-back steps (and the queued-ahead step, generated by a rolled-back version) goes
    with them, every step is generated again, trained once, and served by the version the store records."""
    from tests.train.test_checkpoint_cadence import _now
    from tests.train.trainer_process import kill_when_paused, launch

    config = tmp_path / "recipe.toml"
    recipe = ASYNC_RECIPE.replace("tis_cap = 2.0\n", "tis_cap = 2.0\nweight_decay = 0.1\n")  # versions differ
    config.write_text(recipe.format(out=tmp_path / "ckpt") + "\n[checkpoint]\nevery = 3\n")
    kill_when_paused(launch(config, "db_write:3"), "db_write:3")
    saved = "SELECT step, checkpoint IS NOT NULL FROM run_steps ORDER BY step"
    assert _rows(db, saved) == [(0, True), (1, False), (2, False)]
    # step 3 was queued once step 1 committed (at least its policy): a version in no checkpoint generated it
    assert _rows(db, "SELECT r.policy_step FROM rollout_results r JOIN rollout_work w ON w.id = r.work_id "
                     "WHERE w.step = 3")[0].policy_step in (1, 2)  # fmt: skip
    versions = {r.adapter_sha256 for r in _rows(db, "SELECT adapter_sha256 FROM policy_versions WHERE step > 0")}
    assert len(versions) == 2 and {p.name for p in (tmp_path / "ckpt" / STAGED_DIR).iterdir()} == versions

    resumed = _now(db)
    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "resumed from step 0; rolled back steps 1..2" in err, err[-3000:]
    assert _rows(db, saved) == [(0, True), (1, False), (2, False), (3, True), (4, True)]
    work = _rows(db, "SELECT step, status, extract(epoch FROM created_at) AS at FROM rollout_work ORDER BY step")
    assert [(w.step, w.status) for w in work] == [(s, "used") for s in range(1, 5)]  # one result each, trained once
    assert all(w.at > resumed for w in work)  # nothing generated before the crash was trained on after it
    assert _rows(db, "SELECT step, count(*) FROM run_attempts GROUP BY step ORDER BY step") == [
        (s, 3 * 2) for s in range(1, 5)
    ]
    assert _served_as_recorded(db, _rows(db, "SELECT id FROM runs")[0].id) == 4 * 3 * 2
    assert list((tmp_path / "ckpt" / STAGED_DIR).iterdir()) == []  # steps 3 and 4 are checkpoints: nothing staged


def test_a_worker_that_loses_a_race_with_pruning_serves_the_newer_policy(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker reads step 0 as the newest policy; before it opens step-000000 the trainer commits step 2 and
    prunes step 0 (keep_checkpoints = 2). It loads step 2 and serves step 3; only a run folder that is not there
    gets the mount hint."""
    import shutil
    from types import SimpleNamespace

    from lanpo.db.engine import transaction
    from lanpo.db.repo import queue as queue_repo
    from lanpo.errors import InputError
    from lanpo.train.plumbing.checkpoint import step_dir
    from lanpo.train.producer import worker as worker_mod

    cfg = tiny_config(tmp_path, run_name="pruned", workers=WorkersConfig(external=True, lease_s=30))
    thread, out = _train_in_thread(cfg, db)
    _wait_for(lambda: _rows(db, "SELECT 1 FROM rollout_work WHERE step = 1"), 120, "step 1 to be queued")
    run_id, run_cfg = worker_mod._check_run(db, "pruned", None)
    with transaction(db) as session:
        stale = queue_repo.newest_policy(session, run_id)  # what a worker starting now reads from the store
    assert stale is not None and stale.step == 0 and stale.checkpoint
    assert worker_mod.run_worker(db, "pruned", max_claims=2).claims == 2  # steps 1 and 2, by another worker
    _wait_for(lambda: not Path(stale.checkpoint).exists(), 60, "step 2's commit to prune step-000000")
    assert _rows(db, "SELECT max(step) AS s FROM run_steps WHERE run_id = :r", r=run_id)[0].s == 2

    # the worker that read step 0 before the prune gets there now: its first look at the store is that read
    reads = iter([stale])
    repo = SimpleNamespace(**{**vars(queue_repo), "newest_policy": lambda s, r: next(reads, None) or
                              queue_repo.newest_policy(s, r)})  # fmt: skip
    monkeypatch.setattr(worker_mod, "queue_repo", repo)
    late = worker_mod._Worker(db, run_id, run_cfg, 30.0)
    try:
        assert late.versions == [2] and late.step == 2  # the newer published policy, not an exit
        _wait_for(lambda: _rows(db, "SELECT 1 FROM rollout_work WHERE step = 3"), 60, "step 3 to be queued")
        claim = late.claim()
        assert claim is not None and claim.step == 3 and late.serve(claim)  # and it keeps serving
        thread.join(120)
        assert "result" in out, out.get("error")
        assert out["result"].steps == [1, 2, 3]
        newest = _rows(db, "SELECT step, checkpoint FROM run_steps WHERE run_id = :r AND step = 3", r=run_id)[0]
        # a published step gone while the run's folder is here: said so, without the mount hint
        shutil.rmtree(step_dir(cfg.checkpoint_root(), 3))
        with transaction(db) as session:
            published = queue_repo.newest_policy(session, run_id)
        assert published is not None and published.checkpoint == newest.checkpoint
        with pytest.raises(InputError, match="is gone from") as gone:
            late._load(published)
        assert "mount" not in (gone.value.hint or "")
        # the run's folder itself not here (another machine, not mounted): the mount hint
        cfg.checkpoint_root().rename(tmp_path / "elsewhere")
        with pytest.raises(InputError, match="no run folder") as missing:
            late._load(published)
        assert "mount the run's output_dir" in (missing.value.hint or "")
    finally:
        late.close()


DIST_RECIPE = (
    RECIPE.replace("steps = 4", "steps = 2")
    .replace("batch_size = 3", "batch_size = 2")
    .replace("learning_rate = 1e-3\n", "learning_rate = 1e-3\nweight_decay = 0.1\n")  # each version its own weights
    + """
[workers]
count = 1
lease_s = 30

[checkpoint]
every = 2  # step 1 is staged for the worker by both ranks (rank 0 writes), step 2 checkpointed
"""
)


def test_two_gloo_ranks_train_on_one_local_worker(db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path):
    """torchrun with 2 ranks and `workers.count = 1`: rank 0 takes each step from the queue and scatters the ranks
    their strided shares; every step is generated once, by the worker, trained once and recorded once. Step 1 has
    no checkpoint: the worker generates step 2 from the weights the ranks staged."""
    import json

    from tests.train.test_dist import _torchrun

    config = tmp_path / "recipe.toml"
    config.write_text(DIST_RECIPE.format(out=tmp_path / "ckpt"))
    proc = _torchrun(2, "--config", str(config), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,), (2,)]
    per_step = _rows(
        db, "SELECT step, count(*), count(DISTINCT problem_id) FROM run_attempts GROUP BY step ORDER BY step"
    )
    assert [tuple(r) for r in per_step] == [(1, 2 * 2, 2), (2, 2 * 2, 2)]  # batch_size x rollout.n, nothing twice
    work = _rows(
        db,
        "SELECT w.step, w.status, w.claims, r.policy_step, r.groups FROM rollout_work w "
        "JOIN rollout_results r ON r.work_id = w.id ORDER BY w.step",
    )
    assert [(w.step, w.status, w.claims, w.policy_step) for w in work] == [(1, "used", 1, 0), (2, "used", 1, 1)]
    for w in work:  # both ranks' shares are the worker's groups: no rank generated any of its own
        groups = w.groups if isinstance(w.groups, list) else json.loads(w.groups)
        made = sorted(row["completion"]["text"] for group in groups for row in group["rollouts"])
        stored = _rows(
            db,
            "SELECT a.response FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
            "WHERE g.step = :s AND g.mode <> 'val' ORDER BY a.response",
            s=w.step,
        )
        assert [r.response for r in stored] == made
    staleness = _rows(db, "SELECT value FROM run_metrics WHERE name = 'async/staleness' ORDER BY step")
    assert [s.value for s in staleness] == [0.0, 0.0]
    assert _rows(db, "SELECT step, checkpoint IS NOT NULL FROM run_steps ORDER BY step") == [
        (0, True), (1, False), (2, True)
    ]  # fmt: skip
    assert len({r.adapter_sha256 for r in _rows(db, "SELECT adapter_sha256 FROM policy_versions")}) == 3
    assert _served_as_recorded(db, _rows(db, "SELECT id FROM runs")[0].id) == 2 * 2 * 2
    assert "step    2" in proc.stdout and proc.stdout.count("step    1") == 1  # rank 0 alone reports
