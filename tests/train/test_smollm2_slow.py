"""A few real steps on SmolLM2-135M: SFT warm start into GRPO with feedback, recorded in the store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.feedback.config import DataConfig, FeedbackConfig, InterConfig, SummarizerConfig
from lanpo.train.config import ModelConfig, RolloutConfig, SFTConfig, ValidationConfig
from lanpo.train.loop import train
from tests.train.conftest import tiny_config

# The full lane (bash .ci/run --full; 45-52 s of a main-lane worker, moved when a fresh clone's CI ran past its
# budget). Twins in CI: tests/vllm_engine/test_train.py::test_two_train_steps_with_the_vllm_backend (GRPO steps with
# feedback and validation on SmolLM2, the same trainer), tests/train/test_sft.py (the SFT warm start into GRPO on the
# tiny model) and tests/inference/test_cli.py::test_infer_with_smollm2_self_correct (SmolLM2 through HF generate).
pytestmark = [pytest.mark.slow, pytest.mark.full]


def test_sft_then_grpo_steps_on_smollm2(db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_config(
        tmp_path,
        run_name="smollm2-slow",
        steps=2,
        batch_size=2,
        model=ModelConfig(name="smollm2", threads=min(2, len(os.sched_getaffinity(0)))),
        data=DataConfig(
            dataset="slow_chain_sum",
            task="chain_sum",
            n=8,
            task_options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        ),
        rollout=RolloutConfig(n=2, max_new_tokens=32),
        summarizer=SummarizerConfig(max_new_tokens=32, max_new_per_step=1, max_total_per_step=1),
        sft=SFTConfig(enabled=True, max_steps=2, batch_size=2, n_problems=4, max_length=256, learning_rate=1e-3),
        feedback=FeedbackConfig(mode="both", p_t=1.0, k=2, candidates=4, inter=InterConfig(allow_empty=True)),
        eval=ValidationConfig(every=2, n=2, k=2, max_new_tokens=16),
    )
    result = train(cfg, db=db, progress=False)
    assert result.steps == [1, 2]
    with db.connect() as conn:
        sft_losses = (
            conn.execute(
                sa.text("SELECT m.value FROM run_metrics m JOIN runs r ON r.id = m.run_id WHERE r.kind = 'sft'")
            )
            .scalars()
            .all()
        )
        attempts = conn.execute(sa.text("SELECT response FROM run_attempts WHERE mode <> 'val'")).scalars().all()
        validation = conn.execute(sa.text("SELECT step, count(*) FROM run_attempts WHERE mode = 'val' GROUP BY step"))
    assert len(sft_losses) == 2 and all(0 < x < 20 for x in sft_losses)
    assert len(attempts) == 2 * 2 * 2 and all(isinstance(a, str) for a in attempts)
    assert dict(validation.all()) == {0: 2 * 2, 2: 2 * 2}  # the start and the last step, 2 problems x k = 2
    assert set(result.validation) == {0, 2} and "val/slow_chain_sum-val/mean@2" in result.validation[0]
    for m in result.metrics:
        assert m["response_len/mean"] > 0 and m["time/generate"] > 0
        assert torch.isfinite(torch.tensor(m["reward/mean"]))
    # the warm start moved the adapter away from its zero init (B = 0 in a fresh LoRA)
    from safetensors.torch import load_file

    state = load_file(str(result.checkpoint_dir / "sft" / "adapter" / "adapter_model.safetensors"))
    assert any(t.abs().sum() > 0 for k, t in state.items() if "lora_B" in k)
