"""`lanpo train` with `rollout.backend = "vllm"` (issue 9, section 2): the engine serves exactly the policy.

- Two GRPO steps on SmolLM2 from a merged start (an init adapter): both commit; every attempt carries the
  hash of the adapter that served it, which is the hash of the policy version that generated it (step 1:
  step 0's adapter, step 2: step 1's); the engine's log-probs sit near the trainer's (`engine/logp_abs_diff`).
- The sync itself, on the session engine: after the weights move, `sync` serves the new adapter and every
  completion says so; an adapter swapped behind the trainer's back is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import LanpoError
from lanpo.models import LoraSpec, adapter_sha256, attach_lora
from lanpo.rollout import SamplingParams
from lanpo.rollout.config import VLLMConfig
from lanpo.train.config import (
    DataConfig,
    FeedbackConfig,
    GRPOConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    SFTConfig,
    TrainConfig,
    ValidationConfig,
)
from lanpo.train.producer.served_policy import START_MODEL, ServedPolicy
from tests.vllm_engine.helpers import SavedAdapter, chat, needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]


# By itself, after the rest of the vllm lane (`alone`, .ci/run): its two trainers and their engines take about 9 GB,
# and beside the other xdist worker's engines the lane ran a 24 GiB machine out of memory twice (the OOM killer took
# one worker at 7.9 GB, then the other at 4.6 GB); first in its file, while this worker holds little.
SIGTERM_RECIPE = """
run_name = "vllm-sigterm"
steps = 4
batch_size = 2
output_dir = "{out}"

[model]
name = "{model}"
threads = 1
init_adapter = "{adapter}"

[lora]
r = 16
alpha = 32

[data]
dataset = "sums-term"

[rollout]
backend = "vllm"
n = 2
max_new_tokens = 8
max_prompt_tokens = 256

[rollout.vllm]
max_lora_rank = 16
reproducible = false  # the engine core in processes of its own: what a signal must not leave behind

[feedback]
mode = "none"

[sft]
enabled = false
"""


@pytest.mark.alone
@pytest.mark.long("two trainer processes, each with its engine core in processes of its own, side by side")
def test_a_stopped_or_killed_trainer_leaves_no_engine_behind(
    db_env: str, db: Engine, smollm2_dir: Path, adapters: list[SavedAdapter], tmp_path: Path
) -> None:
    """Two trainers serving from vLLM, each stopped once step 1 has committed and the engine is serving:

    - SIGTERM (a scheduler's stop): the engine's processes go with the trainer, the run is marked failed, exit 143.
      (Before, Python's default SIGTERM exit skipped every cleanup and left EngineCore.)
    - SIGKILL (the OOM killer, a lost job) runs no cleanup at all: vLLM's EngineCore would outlive the trainer for
      ever. The worker watches the process that started the engine (`lanpo.rollout.vllm_worker`) and ends the
      engine's processes when it is gone; the run, which no one could mark, reads `dead` by its heartbeat.

    Each trainer has a run, a dataset and an engine of its own; they start together because an engine's start
    waits on one spawned process after another (engine core, worker), which leaves the second core idle: started
    one after the other, in two tests, they took 80 s each."""
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    from lanpo.db.repo import runs as runs_repo
    from tests.train.trainer_process import launch, wait_for_pause

    procs = {}
    for name, dataset in (("vllm-sigterm", "sums-term"), ("vllm-sigkill", "sums-kill")):
        with transaction(db) as session:
            upsert_problems(session, dataset, [Question(str(i), f"What is {i} + {i}?", str(2 * i)) for i in range(4)])
        recipe = SIGTERM_RECIPE.replace("vllm-sigterm", name).replace("sums-term", dataset)
        config = tmp_path / name / "recipe.toml"
        config.parent.mkdir()
        config.write_text(recipe.format(out=tmp_path / name / "run", model=smollm2_dir, adapter=adapters[1].path))
        procs[name] = launch(config, "generate:2")
    # both stderr pipes drained at once: a trainer whose pipe fills while the other is awaited would stall
    with ThreadPoolExecutor(2) as pool:
        waits = {name: pool.submit(wait_for_pause, proc, "generate:2", 600) for name, proc in procs.items()}
        lines = {name: wait.result() for name, wait in waits.items()}  # step 1 has committed, the engine serves

    # SIGTERM
    proc = procs["vllm-sigterm"]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the vLLM engine core runs in a process of its own"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.stderr is not None
    err = "".join(lines["vllm-sigterm"]) + proc.stderr.read()
    assert proc.wait(timeout=120) == 143, err[-3000:]
    assert "terminated" in err and "Traceback" not in err, err[-3000:]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"SIGTERM left running: {[(p.pid, p.name()) for p in alive]}"
    with db.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM runs WHERE name = 'vllm-sigterm'")).scalar() == "failed"

    # SIGKILL
    proc = procs["vllm-sigkill"]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert sum(c.name().startswith("VLLM::") for c in children) >= 2, [c.name() for c in children]  # core, worker
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"SIGKILL left running: {[(p.pid, p.name()) for p in alive]}"
    with transaction(db) as session:
        [row] = runs_repo.list_runs(session, ["vllm-sigkill"])
    assert row.status == "running" and row.liveness().state == "dead" and row.last_step == 1


def test_two_train_steps_with_the_vllm_backend(
    db: Engine, smollm2_dir: Path, adapters: list[SavedAdapter], tmp_path: Path
) -> None:
    from lanpo.train.loop import train

    with transaction(db) as session:
        upsert_problems(
            session, "sums", [Question(str(i), f"What is {i} + {2 * i}?", str(3 * i)) for i in range(1, 9)]
        )
        upsert_problems(session, "sums-val", [Question(str(i), f"What is {i} + {i}?", str(2 * i)) for i in (20, 21)])
    cfg = TrainConfig(
        run_name="vllm-two-steps",
        steps=2,
        batch_size=2,
        output_dir=str(tmp_path / "run"),
        model=ModelConfig(name=str(smollm2_dir), threads=1, init_adapter=str(adapters[1].path)),
        lora=LoraConfig(r=16, alpha=32),
        data=DataConfig(dataset="sums"),
        rollout=RolloutConfig(
            backend="vllm",
            n=4,
            max_new_tokens=24,
            max_prompt_tokens=512,
            vllm=VLLMConfig(max_lora_rank=16, lora_sync="adapter"),  # the adapter path (auto merges on CPU)
        ),
        grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, tis_cap=2.0),
        feedback=FeedbackConfig(mode="intra", p_t=1.0, k=1, candidates=2),
        sft=SFTConfig(enabled=False),
        eval=ValidationConfig(every=2, dataset="sums-val", n=2, k=2, max_new_tokens=16),
    )
    result = train(cfg, db=db, progress=False)
    assert result.steps == [1, 2]
    assert (Path(cfg.output_dir) / START_MODEL / "model.safetensors").is_file()  # the merged start vLLM loaded

    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT g.step, g.mode, a.served_adapter_sha256 AS served, pv.adapter_sha256 AS expected, "
                "pv.step AS pv "
                "FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
                "JOIN policy_versions pv ON pv.id = g.policy_version_id WHERE g.run_id = :r"
            ),
            {"r": result.run_id},
        ).all()
        diff = conn.scalar(
            sa.text("SELECT max(value) FROM run_metrics WHERE run_id = :r AND name = 'engine/logp_abs_diff'"),
            {"r": result.run_id},
        )
        val = conn.scalar(
            sa.text("SELECT count(*) FROM run_metrics WHERE run_id = :r AND name LIKE 'val/%mean@2'"),
            {"r": result.run_id},
        )
    training = [r for r in rows if r.mode != "val"]
    assert len(training) == 2 * 2 * 4
    assert all(r.served == r.expected for r in rows), "an attempt served by another adapter than its version's"
    assert {r.step - r.pv for r in training} == {1}  # step s sampled by the policy committed at step s - 1
    assert {r.pv for r in rows if r.mode == "val"} == {0, 2}  # validation of the start and of the last step
    # the start is merged into the engine's weights: a fresh adapter (B = 0) on it is the start itself, and the
    # engine's bf16 log-probs sit near the trainer's fp32 ones (measured 0.02-0.03 mean per token)
    assert diff is not None and diff < 0.2, diff
    assert val == 2


ATTEMPT_VERSIONS = sa.text(
    "SELECT g.step, a.served_adapter_sha256 AS served, pv.adapter_sha256 AS own, pv.served_sha256 AS tied, "
    "pv.step AS pv FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
    "JOIN policy_versions pv ON pv.id = g.policy_version_id WHERE g.run_id = :r"
)  # every attempt of a run beside the policy version that sampled it


def _sums_run(db: Engine, name: str, tmp_path: Path, **parts: Any) -> TrainConfig:
    """A 1-step run on 8 sums, 2 prompts x 4 rollouts of 16 tokens on the vLLM engine, no feedback; `parts`
    replace TrainConfig's fields (model, lora, rollout, grpo, steps)."""
    with transaction(db) as session:
        upsert_problems(session, name, [Question(str(i), f"What is {i} + {2 * i}?", str(3 * i)) for i in range(1, 9)])
    defaults: dict[str, Any] = {
        "steps": 1,
        "rollout": RolloutConfig(backend="vllm", n=4, max_new_tokens=16, max_prompt_tokens=256),
        "grpo": GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, tis_cap=2.0),
    }
    return TrainConfig(
        run_name=name, batch_size=2, output_dir=str(tmp_path / "run"), data=DataConfig(dataset=name),
        feedback=FeedbackConfig(mode="none"), sft=SFTConfig(enabled=False), eval=ValidationConfig(every=0),
        **{**defaults, **parts},
    )  # fmt: skip


def _one_hash_per_version(rows: list[Any]) -> None:
    """Two steps of 2 x 4 attempts, each sampled by the version before; new served weights exactly when the update
    moved the policy (a step whose groups all share one reward moves nothing), never NULL."""
    assert len(rows) == 2 * 2 * 4 and {r.step - r.pv for r in rows} == {1}
    assert None not in {r.served for r in rows}
    assert len({r.served for r in rows}) == len({r.own for r in rows}) == len({(r.own, r.served) for r in rows})


@pytest.mark.long("two runs (the first and its resume), each with its own engine, loading full weights every step")
def test_full_fine_tuning_trains_on_the_engine_and_resumes_on_the_committed_weights(
    db: Engine, smollm2_dir: Path, adapters: list[SavedAdapter], tmp_path: Path
) -> None:
    """`lora.enabled = false` with vLLM: after every update all the weights are loaded into the engine in place.
    Every attempt carries the hash of the weights that served it -- never NULL, the start's too -- and that is
    the hash of its policy version's checkpoint. A resumed run's engine serves the last committed step's
    weights (not the start's): the step after the resume is sampled by step 1's checkpoint."""
    from lanpo.train.loop import train

    cfg = _sums_run(
        db, "vllm-full-ft", tmp_path, lora=LoraConfig(enabled=False),
        model=ModelConfig(name=str(smollm2_dir), threads=1, init_adapter=str(adapters[1].path)),
        grpo=GRPOConfig(learning_rate=1e-5, warmup_ratio=0.0, tis_cap=2.0),
    )  # fmt: skip
    first = train(cfg, db=db, progress=False)
    assert first.steps == [1]
    resumed = train(replace(cfg, steps=2), db=db, progress=False, resume=True)
    assert resumed.steps == [2] and resumed.run_id == first.run_id

    with db.connect() as conn:
        rows = conn.execute(ATTEMPT_VERSIONS, {"r": first.run_id}).all()
        sync = conn.scalars(
            sa.text("SELECT value FROM run_metrics WHERE run_id = :r AND name = 'time/sync' ORDER BY step"),
            {"r": first.run_id},
        ).all()
    _one_hash_per_version(rows)
    assert all(r.served == r.own and r.tied is None for r in rows), rows  # the checkpoint's own hash
    assert len(sync) == 2 and all(s > 0 for s in sync)


def test_merged_lora_serves_the_folded_weights_tied_to_the_adapters_version(
    db: Engine, smollm2_dir: Path, tmp_path: Path
) -> None:
    """`rollout.vllm.lora_sync = "merged"`: the engine (started without LoRA slots) serves the adapter folded into
    the base weights. Every attempt carries the merged weights' hash, which the store ties to the adapter's policy
    version (`policy_versions.served_sha256`), and the engine's log-probs sit near the trainer's PEFT model's."""
    from lanpo.train.loop import train

    cfg = _sums_run(
        db, "vllm-merged", tmp_path, steps=2, model=ModelConfig(name=str(smollm2_dir), threads=1),
        lora=LoraConfig(r=16, alpha=32),
        rollout=RolloutConfig(
            backend="vllm", n=4, max_new_tokens=16, max_prompt_tokens=256, vllm=VLLMConfig(lora_sync="merged")
        ),
    )  # fmt: skip
    result = train(cfg, db=db, progress=False)
    assert result.steps == [1, 2]
    with db.connect() as conn:
        rows = conn.execute(ATTEMPT_VERSIONS, {"r": result.run_id}).all()
        diff = conn.scalar(
            sa.text("SELECT max(value) FROM run_metrics WHERE run_id = :r AND name = 'engine/logp_abs_diff'"),
            {"r": result.run_id},
        )
    _one_hash_per_version(rows)
    assert all(r.served == r.tied and r.tied != r.own for r in rows), rows
    assert diff is not None and diff < 0.2, diff


def test_sync_serves_the_moved_weights_and_refuses_a_swapped_adapter(
    backend: Any, hf_smollm2: tuple[Any, Any], adapters: list[SavedAdapter]
) -> None:
    base, tokenizer = hf_smollm2
    torch.manual_seed(1234)  # not the seeds of the saved `adapters`: their weights would be these
    model = attach_lora(base, LoraSpec(rank=16, alpha=32))
    engine = ServedPolicy(backend, model, "vllm")
    try:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
        first = engine.sync()
        assert first == adapter_sha256(model)
        assert {c.served_adapter_sha256 for g in engine.generate(chat(tokenizer), 2, params) for c in g} == {first}

        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        second = engine.sync()
        assert second != first and second == adapter_sha256(model)
        groups = engine.generate(chat(tokenizer), 2, params)
        assert {c.served_adapter_sha256 for g in groups for c in g} == {second}

        assert adapters[0].sha256 not in (first, second)
        backend.set_adapter(adapters[0].path)  # behind the trainer's back
        with pytest.raises(LanpoError, match="the step is refused"):
            engine.generate(chat(tokenizer), 2, params)
    finally:
        model.unload()  # the session's HF model without the LoRA layers again
