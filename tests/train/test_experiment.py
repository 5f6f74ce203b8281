"""`lanpo experiment` on the tiny model: one shared start, arms x seeds recorded as runs of one experiment, each
validated on the same held-out set; a rerun skips what finished; the report holds the arms' table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.db.repo.sampling import Ranking
from lanpo.train.sft.warm_start import write_pairs
from tests.train.test_start import PAIRS

RECIPE = """
run_name = "unused"
steps = 2
batch_size = 3
seed = 0

[model]
name = "tiny-random"
threads = 1

[lora]
r = 4
alpha = 8

[data]
dataset = "toy"

[rollout]
n = 2
max_new_tokens = 8

[grpo]
learning_rate = 1e-3
warmup_ratio = 0.0

[feedback]
mode = "both"
p_t = 1.0
k = 2
candidates = 4

[feedback.inter]
gamma = 0.0

[summarizer]
min_reward = 0.0
max_new_tokens = 8
max_new_per_step = 2
require_format = false  # a random model writes no lesson: admit its text, fill the pool

[sft]
enabled = true
data = "{pairs}"
max_steps = 2
batch_size = 2
max_length = 64

[eval]
every = 1
dataset = "toy-val"
n = 2
k = 2
max_new_tokens = 6
"""

EXPERIMENT = """
name = "tiny-exp"
recipe = "recipe.toml"
seeds = [0, 1]
arms = ["grpo", "lanpo-both"]
output_dir = "{out}"

[relevance]
judge = "{judge}"
top_k = 2
stage1 = "bm25"
"""


def experiment_file(db: Engine, tmp_path: Path, judge: Path, name: str = "tiny-exp", extra: str = "") -> Path:
    """The tiny experiment's files (SFT pairs, recipe, `<name>.toml` writing under tmp_path/<name>) and its held-out
    set in the store; returns the experiment file."""
    with transaction(db) as session:
        upsert_problems(session, "toy-val", [Question("v0", "What is 9 * 9?", "81"), Question("v1", "2 * 3?", "6")])
    write_pairs(PAIRS, tmp_path / "pairs.jsonl")
    (tmp_path / "recipe.toml").write_text(RECIPE.format(pairs=tmp_path / "pairs.jsonl"))
    config = tmp_path / f"{name}.toml"
    text = EXPERIMENT.format(out=tmp_path / (name if name != "tiny-exp" else "exp"), judge=judge)
    config.write_text(text.replace('"tiny-exp"', f'"{name}"') + extra)
    return config


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a HF folder: the relevance judge the experiment loads by path."""
    from lanpo.models import tiny_causal_lm

    path = tmp_path_factory.mktemp("tiny-judge")
    model, tokenizer = tiny_causal_lm(seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_experiment_runs_arms_by_seed_from_one_start(
    run_cli, db: Engine, toy_problems: list[int], tmp_path: Path, tiny_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    config = experiment_file(db, tmp_path, tiny_dir)
    # one run after another: the runs' ids then follow the seed-by-seed order (side by side, two workers create
    # their runs in whichever order they start; --jobs auto would depend on the machine's cores)
    first = run_cli("experiment", "--config", config, "--jobs", "1")
    assert first.code == 0, first.err
    with db.connect() as conn:
        runs = conn.execute(
            sa.text(
                "SELECT r.name, r.arm, r.status, (r.config->>'seed')::int, r.config->'model'->>'init_adapter', "
                "e.name FROM runs r JOIN experiments e ON e.id = r.experiment_id ORDER BY r.id"
            )
        ).all()
        val = conn.execute(
            sa.text(
                "SELECT count(DISTINCT run_id) FROM run_metrics WHERE name = 'val/toy-val/mean@2' AND step IN (0, 2)"
            )
        ).scalar()
        status = conn.execute(sa.text("SELECT status FROM experiments WHERE name = 'tiny-exp'")).scalar()
    start = str(tmp_path / "exp" / "sft" / "adapter")
    assert [(r[0], r[1], r[2], r[3]) for r in runs] == [
        ("tiny-exp-grpo-s0", "grpo", "finished", 0),
        ("tiny-exp-lanpo-both-s0", "lanpo-both", "finished", 0),
        ("tiny-exp-grpo-s1", "grpo", "finished", 1),
        ("tiny-exp-lanpo-both-s1", "lanpo-both", "finished", 1),
    ]
    assert {r[4] for r in runs} == {start} and {r[5] for r in runs} == {"tiny-exp"}
    assert val == 4 and status == "finished"
    report = (tmp_path / "exp" / "report" / "report.md").read_text()
    assert "grpo" in report and "lanpo-both" in report
    again = run_cli("experiment", "--config", config, "--no-report")
    assert again.code == 0 and again.out.count("finished before, skipped") == 4
    changed = run_cli("experiment", "--config", config, "--set", "steps=3")
    assert changed.code == 2 and "exists with another configuration" in changed.err
    one_arm = run_cli("experiment", "--config", config, "--no-report", "--arms", "grpo", "--seeds", "1")
    assert one_arm.code == 0 and one_arm.out.count("finished before, skipped") == 1  # a selection, the same experiment

    # An experiment stored before a config key existed is still the same experiment when today's file keeps that key's
    # default (`rollout.feedback_max_new_tokens` was added after experiments had been run); not when it sets another
    # value, nor when the stored config holds a key today's schema does not know.
    def stored(expression: str) -> None:
        with transaction(db) as session:
            session.execute(sa.text(f"UPDATE experiments SET config = {expression} WHERE name = 'tiny-exp'"))

    stored("config #- '{base,rollout,feedback_max_new_tokens}'")
    older = run_cli("experiment", "--config", config, "--no-report")
    assert older.code == 0 and older.out.count("finished before, skipped") == 4, older.err
    newer_value = run_cli("experiment", "--config", config, "--set", "rollout.feedback_max_new_tokens=5")
    assert newer_value.code == 2 and "exists with another configuration" in newer_value.err
    stored("jsonb_set(config, '{base,rollout,removed_key}', '1')")
    removed = run_cli("experiment", "--config", config, "--no-report")
    assert removed.code == 2 and "exists with another configuration" in removed.err


def test_runs_side_by_side_train_as_they_do_alone(
    run_cli, db: Engine, toy_problems: list[int], tmp_path: Path, tiny_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """`--jobs 2` trains each run in a worker process of its own: the same runs, step for step the same rewards, losses
    and held-out figures as one after another in this process (a run's seed decides its random numbers, not what
    else runs). A run that fails in a worker leaves the others to finish, and the command ends with one error line
    naming the run and its log."""
    for name, jobs in (("alone", "1"), ("side", "2")):
        config = experiment_file(db, tmp_path, tiny_dir, name, '\n[arm.broken]\n"data.dataset" = "never-imported"\n')
        done = run_cli("experiment", "--config", config, "--no-report", "--jobs", jobs, "--seeds", "0")
        assert done.code == 0, done.err
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT split_part(r.name, '-', 1), r.arm, m.step, m.name, m.value FROM run_metrics m "
                "JOIN runs r ON r.id = m.run_id "
                "WHERE (r.name LIKE 'alone-%' OR r.name LIKE 'side-%') AND r.arm IS NOT NULL"
            )
        ).all()
    by = {exp: {(arm, step, name): v for e, arm, step, name, v in rows if e == exp} for exp in ("alone", "side")}
    kept = {k for k in by["alone"] if not k[2].startswith(("time/", "memory/", "throughput/"))}
    assert len(kept) > 40 and {k[0] for k in kept} == {"grpo", "lanpo-both"}
    assert {k: by["side"].get(k) for k in kept} == {k: by["alone"][k] for k in kept}
    assert any(k[2].startswith("val/") for k in kept) and any(k[2].startswith("reward") for k in kept)

    broken = tmp_path / "broken.toml"
    broken.write_text(
        (tmp_path / "side.toml")
        .read_text()
        .replace('"side"', '"broken"')
        .replace('arms = ["grpo", "lanpo-both"]', 'arms = ["broken", "grpo"]')
    )
    failed = run_cli("experiment", "--config", broken, "--no-report", "--jobs", "2", "--seeds", "0")
    assert failed.code == 2 and "Traceback" not in failed.err
    assert "error: run broken-broken-s0 failed" in failed.err and "broken-broken-s0.log" in failed.err
    with db.connect() as conn:
        status = dict(conn.execute(sa.text("SELECT name, status FROM runs WHERE name LIKE 'broken-%'")).all())
        exp_status = conn.execute(sa.text("SELECT status FROM experiments WHERE name = 'broken'")).scalar()
    assert status["broken-grpo-s0"] == "finished" and exp_status == "failed"
    assert (tmp_path / "side" / "logs" / "side-grpo-s0.log").read_text().count("steps in") == 1


def test_jobs_are_checked(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_pairs(PAIRS, tmp_path / "pairs.jsonl")
    (tmp_path / "recipe.toml").write_text(RECIPE.format(pairs=tmp_path / "pairs.jsonl"))
    (tmp_path / "exp.toml").write_text(EXPERIMENT.format(out=tmp_path / "exp", judge="x"))
    for bad in ("0", "-1", "two"):
        result = run_cli("experiment", "--config", tmp_path / "exp.toml", "--jobs", bad)
        assert result.code == 2 and "--jobs must be a whole number" in result.err and "hint:" in result.err


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _paused_experiment(  # type: ignore[no-untyped-def]
    db: Engine, tmp_path: Path, tiny_dir: Path, name: str, own_group: bool = False
):
    """`lanpo experiment` (two arms, seed 0, two workers) started and waited for until both workers pause at step
    2's write: (the process, its command, the workers' pids, the runs' logs). `own_group`: in a process group of its
    own, as a terminal's foreground job is (so that a test can send the group Ctrl-C's SIGINT)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from lanpo.train.plumbing.pause import PAUSE_ENV
    from tests.train.trainer_process import CLI

    config = experiment_file(db, tmp_path, tiny_dir, name)
    args = [sys.executable, "-c", CLI, "experiment", "--config", str(config), "--no-report", "--jobs", "2"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", **{PAUSE_ENV: "db_write:2"})
    proc = subprocess.Popen(
        [*args, "--seeds", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
        # A terminal's foreground job takes SIGINT as Python's KeyboardInterrupt; a job a script starts in the
        # background (CI's lanes) inherits SIGINT ignored, and Python then never installs its handler.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if own_group else None,
    )
    logs = [tmp_path / name / "logs" / f"{name}-{arm}-s0.log" for arm in ("grpo", "lanpo-both")]
    deadline = time.monotonic() + 240
    while not all(log.exists() and "lanpo-paused" in log.read_text() for log in logs):
        assert proc.poll() is None and time.monotonic() < deadline, "the workers did not reach step 2"
        time.sleep(0.5)
    workers = [p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(workers) == 2
    return proc, config, workers, logs


def _statuses(db: Engine, name: str) -> tuple[dict[str, str], int]:
    """The runs' statuses and how many step metrics they stored."""
    with db.connect() as conn:
        status = dict(conn.execute(sa.text(f"SELECT name, status FROM runs WHERE name LIKE '{name}-%-s0'")).all())
        steps = conn.execute(
            sa.text(
                f"SELECT count(*) FROM run_metrics m JOIN runs r ON r.id = m.run_id WHERE r.name LIKE '{name}-%-s0'"
            )
        ).scalar()
    return status, int(steps or 0)


def test_a_killed_worker_ends_the_experiment_with_an_error_and_loses_nothing(
    run_cli, db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path, tiny_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    """A worker killed outright (as the kernel's OOM killer does) breaks the process pool: the command ends with one
    error line, no traceback, exit 2; the runs stay unfinished in the store, and running the command again resumes
    and finishes them."""
    import os
    import signal

    proc, config, workers, logs = _paused_experiment(db, tmp_path, tiny_dir, "killed")
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.startswith("error: run killed-") and "worker process died" in err and "hint:" in err
    assert "Traceback" not in err
    status, steps = _statuses(db, "killed")
    # the killed run stays `running` (nothing marked it); the pool stops the other with SIGTERM, and it stops as a
    # terminated run does (marked failed): neither finished, step 1 of each stored
    assert sorted(status.values()) == ["failed", "running"] and steps > 0
    again = run_cli("experiment", "--config", config, "--no-report", "--jobs", "2", "--seeds", "0")
    assert again.code == 0, again.err
    assert set(_statuses(db, "killed")[0].values()) == {"finished"}
    assert all("resuming" in log.read_text() for log in logs)


def test_sigterm_stops_the_experiment_and_its_runs_without_waiting_for_them(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path, tiny_dir: Path
) -> None:
    """SIGTERM to `lanpo experiment` (a scheduler stopping the job) while its runs are mid-step: it stops them (it
    used to wait for each to finish its steps) and exits 143 with `terminated`; no worker outlives it, and each run
    keeps the steps it committed, marked failed. That a rerun resumes runs left failed or running is the killed-worker
    test's (its pool leaves one of each)."""
    import os
    import signal
    import time

    proc, _, workers, logs = _paused_experiment(db, tmp_path, tiny_dir, "stopped")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # the paused runs would otherwise wait for ever
    assert proc.returncode == 143 and err.strip().endswith("terminated"), err
    assert "Traceback" not in err and time.monotonic() - started < 60
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers), "a worker outlived the experiment"
    status, steps = _statuses(db, "stopped")
    assert "finished" not in status.values() and steps > 0  # step 1 of each is stored
    assert all("Terminated" in log.read_text() for log in logs)  # each run stopped on SIGTERM, not killed
    assert set(status.values()) == {"failed"}


def test_ctrl_c_stops_the_runs_through_the_parent_alone(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path, tiny_dir: Path
) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group. The workers ignore it and the parent stops them
    with SIGTERM, so each run stops one way, with its cleanup whole: `Terminated` in its log, never a
    KeyboardInterrupt (a worker that took the SIGINT too began its rollback, the parent's SIGTERM broke into it,
    and the command hung). The command exits 130 with `aborted`; no worker outlives it; each run keeps its committed
    steps."""
    import os
    import signal
    import subprocess

    proc, _, workers, logs = _paused_experiment(db, tmp_path, tiny_dir, "ctrl-c", own_group=True)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # before the fix: a run's rollback cut by the SIGTERM, and the command hung
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("Ctrl-C did not stop the experiment within 60 s")
    assert proc.returncode == 130 and err.strip().endswith("aborted"), err
    assert "Traceback" not in err
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers), "a worker outlived the experiment"
    status, steps = _statuses(db, "ctrl-c")
    assert "finished" not in status.values() and steps > 0
    for log in logs:
        text = log.read_text()
        assert "Terminated" in text and "KeyboardInterrupt" not in text, text[-2000:]


def test_workers_take_the_costlier_arms_of_a_seed_first(tmp_path: Path) -> None:
    """Side by side, a seed's feedback and MEL arms start before its GRPO run (their steps are longer), seeds keep
    the experiment's order, and arms of equal cost keep the file's order."""
    from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config, side_by_side_order
    from lanpo.train.config import TrainConfig

    exp = ExperimentConfig(
        name="order", recipe="r.toml", seeds=[2, 0], arms=["grpo", "lanpo-intra", "mel", "lanpo-both"]
    )
    cfgs = [arm_config(TrainConfig(), DEFAULT_ARMS[a], a, s, exp) for s in exp.seeds for a in exp.arms]
    assert [(c.seed, c.arm) for c in side_by_side_order(cfgs)] == [
        (2, "lanpo-intra"), (2, "mel"), (2, "lanpo-both"), (2, "grpo"),
        (0, "lanpo-intra"), (0, "mel"), (0, "lanpo-both"), (0, "grpo"),
    ]  # fmt: skip


def test_the_value_aware_arm_is_lanpo_both_with_lessons_on_probation() -> None:
    """lanpo-both-value differs from lanpo-both in the inter ranking and retirement only (issue 64's reuse check)."""
    from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
    from lanpo.train.config import TrainConfig

    exp = ExperimentConfig(name="value", recipe="r.toml", arms=["lanpo-both", "lanpo-both-value"])
    both, value = (arm_config(TrainConfig(), DEFAULT_ARMS[a], a, 0, exp) for a in exp.arms)
    assert (both.feedback.inter.rank, both.store.retire_below) == ("relevance", None)
    assert (value.feedback.inter.rank, value.store.retire_below) == ("value", 0.0)
    assert value.feedback.mode == both.feedback.mode == "both" and value.method == both.method == "lanpo"


def test_the_pool_prior_arm_is_the_value_arm_with_the_pool_s_prior() -> None:
    """lanpo-both-value-pool differs from lanpo-both-value in the value rule's prior mean only (migration 0025)."""
    from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
    from lanpo.train.config import TrainConfig

    exp = ExperimentConfig(name="pool", recipe="r.toml", arms=["lanpo-both-value", "lanpo-both-value-pool"])
    value, pool = (arm_config(TrainConfig(), DEFAULT_ARMS[a], a, 0, exp) for a in exp.arms)
    assert (value.feedback.inter.prior, pool.feedback.inter.prior) == ("zero", "pool")
    assert pool.feedback.inter.ranking == Ranking("value", prior="pool")
    assert (pool.feedback.inter.rank, pool.store.retire_below) == (value.feedback.inter.rank, value.store.retire_below)


@pytest.mark.parametrize(
    ("arm", "gate"), [("lanpo-both-value-gate", "value"), ("lanpo-both-value-thompson", "thompson")]
)
def test_the_gate_arms_are_the_value_arm_with_an_intra_gate(arm: str, gate: str) -> None:
    """lanpo-both-value-gate and -thompson differ from lanpo-both-value in the intra gate only
    (lanpo.feedback.intra_gate)."""
    from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
    from lanpo.train.config import TrainConfig

    exp = ExperimentConfig(name="gate", recipe="r.toml", arms=["lanpo-both-value", arm])
    value, gated = (arm_config(TrainConfig(), DEFAULT_ARMS[a], a, 0, exp) for a in exp.arms)
    assert (value.feedback.intra.gate, gated.feedback.intra.gate) == ("none", gate)
    assert gated.feedback.inter == value.feedback.inter and gated.store == value.store


def test_the_null_arm_is_grpo_with_other_rounding() -> None:
    """grpo-fp32 differs from grpo in its forwards' precision only: a yardstick for how far runs of one method land
    apart, not another method."""
    from lanpo.experiment import DEFAULT_ARMS, ExperimentConfig, arm_config
    from lanpo.train.config import TrainConfig

    base = TrainConfig()
    base = replace(base, grpo=replace(base.grpo, autocast="auto"))  # the learning recipes' setting
    exp = ExperimentConfig(name="null", recipe="r.toml", arms=["grpo", "grpo-fp32"])
    grpo, null = (arm_config(base, DEFAULT_ARMS[a], a, 0, exp) for a in exp.arms)
    assert (grpo.grpo.autocast, null.grpo.autocast) == ("auto", "off")
    assert replace(null.grpo, autocast="auto") == grpo.grpo and null.feedback == grpo.feedback
