"""Resume after SIGKILL: killed during generation and during the step's database write, the run continues with
no duplicate or missing step rows, and the checkpoint on disk matches the policy version in the database.
Stopped by SIGTERM (a scheduler's stop), the run is marked failed on the way out, and resumes the same way."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.train.plumbing import checkpoint as ckpt
from tests.db.store_helpers import assert_planned_within_growth
from tests.train.trainer_process import kill_when_paused, launch

RECIPE = """
run_name = "resume-test"
steps = 4
batch_size = 3
seed = 0
output_dir = "{out}"

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
max_new_tokens = 16

[grpo]
learning_rate = 1e-3

[feedback]
mode = "both"
p_t = 1.0
k = 2
candidates = 4

[feedback.inter]
gamma = 0.5
scorer = "test"

[summarizer]
min_reward = 0.0
max_new_tokens = 24
max_new_per_step = 2
require_format = false  # a random model writes no lesson: admit its text, fill the pool
"""


def _rows(db: Engine, sql: str) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


@pytest.mark.usefixtures("fresh_statistics")  # it asserts the planner's statistics
def test_sigkill_during_generation_and_db_write_then_resume(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    out = tmp_path / "ckpt"
    config = tmp_path / "recipe.toml"
    config.write_text(RECIPE.format(out=out))

    # 1. killed while generating step 2: steps 0 and 1 are committed
    kill_when_paused(launch(config, "generate:2", resume=False), "generate:2")
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,)]

    # 2. resumed, then killed inside step 3's transaction (attempts inserted, not committed; checkpoint written)
    kill_when_paused(launch(config, "db_write:3", resume=True), "db_write:3")
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,), (2,)]
    assert _rows(db, "SELECT count(*) FROM run_attempts WHERE step = 3") == [(0,)]
    assert ckpt.step_dir(out, 3).exists(), "the step-3 checkpoint was written before the (killed) commit"

    # 3. resumed to the end
    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(s,) for s in range(5)]
    assert _rows(db, "SELECT step, count(*) FROM policy_versions GROUP BY step ORDER BY step") == [
        (s, 1) for s in range(5)
    ]
    assert _rows(db, "SELECT step, count(*) FROM run_attempts GROUP BY step ORDER BY step") == [
        (s, 3 * 2) for s in range(1, 5)
    ]
    assert _rows(
        db, "SELECT count(*) FROM (SELECT step, name FROM run_metrics GROUP BY 1, 2 HAVING count(*) > 1) d"
    ) == [(0,)]
    assert _rows(db, "SELECT DISTINCT step FROM run_metrics ORDER BY step") == [(s,) for s in range(1, 5)]
    assert _rows(db, "SELECT status FROM runs") == [("finished",)]
    # the steps' bulk writes left the planner their rows (lanpo.db.stats), as `lanpo train` returns
    tables = ("rollout_groups", "attempts", "group_contexts", "experiences", "experience_versions")
    assert_planned_within_growth(db, *tables)
    # every attempt and experience points at a committed policy version of its own run
    assert _rows(
        db, "SELECT count(*) FROM run_attempts a LEFT JOIN run_steps s ON s.step = a.step WHERE s.step IS NULL"
    ) == [(0,)]

    # the checkpoint the database names for the last step holds exactly the adapter it records
    (path, sha) = _rows(
        db,
        "SELECT s.checkpoint, pv.adapter_sha256 FROM run_steps s "
        "JOIN policy_versions pv ON pv.id = s.policy_version_id WHERE s.step = 4",
    )[0]
    from lanpo.models import adapter_sha256
    from lanpo.train.config import LoraConfig, ModelConfig
    from lanpo.train.policy import load_adapter_weights, load_policy

    model, _ = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=123)
    load_adapter_weights(model, Path(path) / ckpt.ADAPTER_DIR)
    assert adapter_sha256(model) == sha


def test_full_fine_tuning_resumes_from_the_full_weights_of_the_last_committed_step(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """Killed after step 3's checkpoint was written but before its commit, a full fine-tuning run resumes from step
    2's weights (the database decides, not the newest folder), with the start as its reference."""
    from safetensors.torch import load_file

    from lanpo.models import model_dir_sha256, tiny_causal_lm
    from lanpo.train.config import load_config
    from lanpo.train.state import setup

    out = tmp_path / "ckpt"
    config = tmp_path / "recipe.toml"
    # weight decay moves every weight at every step, even where the tiny model's rewards leave no advantage
    recipe = RECIPE.format(out=out).replace("[lora]\n", "[lora]\nenabled = false\n")
    config.write_text(recipe.replace("learning_rate = 1e-3\n", "learning_rate = 1e-3\nweight_decay = 0.5\n"))

    kill_when_paused(launch(config, "generate:2", resume=False), "generate:2")
    kill_when_paused(launch(config, "db_write:3", resume=True), "db_write:3")
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,), (2,)]
    step2, step3 = (load_file(str(ckpt.step_dir(out, s) / "model" / "model.safetensors")) for s in (2, 3))
    assert any(not torch.equal(step2[k], step3[k]) for k in step2)

    trainer, first = setup(load_config(config), db, resume=True)
    assert first == 3
    weights = trainer.policy.model.state_dict()
    assert all(torch.equal(weights[k], step2[k]) for k in step2), "not step 2's weights"
    start = tiny_causal_lm(seed=0)[0].state_dict()
    reference = trainer.policy.reference.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(reference[k], start[k]) for k in start), "the reference is not the start"
    assert any(not torch.equal(weights[k], start[k]) for k in start)

    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(s,) for s in range(5)]
    (path, sha) = _rows(
        db,
        "SELECT s.checkpoint, pv.adapter_sha256 FROM run_steps s "
        "JOIN policy_versions pv ON pv.id = s.policy_version_id WHERE s.step = 4",
    )[0]
    assert model_dir_sha256(Path(path) / "model") == sha


def test_sigterm_marks_the_run_failed_and_resume_finishes_it(
    db_env: str, db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    config = tmp_path / "recipe.toml"
    config.write_text(RECIPE.format(out=tmp_path / "ckpt"))

    proc = launch(config, "generate:2", resume=False)
    err = "".join(kill_when_paused(proc, "generate:2", sig=signal.SIGTERM))
    assert proc.returncode == 143 and "terminated" in err and "Traceback" not in err, err[-3000:]
    assert _rows(db, "SELECT status, finished_at IS NOT NULL FROM runs") == [("failed", True)]
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(0,), (1,)]

    proc = launch(config, None, resume=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert _rows(db, "SELECT status FROM runs") == [("finished",)]
    assert _rows(db, "SELECT step FROM run_steps ORDER BY step") == [(s,) for s in range(5)]
