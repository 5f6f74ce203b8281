"""MEL end to end on the real SmolLM2-135M: SFT warm start, then MEL steps whose diagnoses and replays are real
model generations, recorded in the store with complete provenance."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.engine import transaction
from lanpo.db.repo import meta as meta_repo
from lanpo.mel.config import MELConfig
from lanpo.train.config import DataConfig, FeedbackConfig, GRPOConfig, ModelConfig, RolloutConfig, SFTConfig
from lanpo.train.loop import train
from tests.train.conftest import tiny_config

pytestmark = pytest.mark.slow


def test_mel_steps_on_smollm2(db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_config(
        tmp_path,
        run_name="mel-smollm2-slow",
        method="mel",
        steps=3,
        batch_size=2,
        model=ModelConfig(name="smollm2", threads=min(2, len(os.sched_getaffinity(0)))),
        lora=tiny_config(tmp_path).lora,
        data=DataConfig(
            dataset="slow_mel_chain_sum",
            task="chain_sum",
            n=8,
            task_options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        ),
        rollout=RolloutConfig(n=4, max_new_tokens=48),
        grpo=GRPOConfig(learning_rate=5e-5, warmup_ratio=0.0, skip_zero_spread=True),
        feedback=FeedbackConfig(mode="none", p_t=0.0),
        sft=SFTConfig(
            enabled=True,
            max_steps=7,
            batch_size=4,
            n_problems=16,
            skill_problems=4,
            max_length=384,
            learning_rate=5e-4,
        ),
        mel=MELConfig(pairs_per_problem=1, replays=2, diagnosis_max_new_tokens=64, validation="any_success"),
    )
    result = train(cfg, engine=db, progress=False)
    assert result.steps == [1, 2, 3]
    for m in result.metrics:
        assert m["mel/pairs"] <= m["mel/groups/qualifying"] and m["mel/candidates"] <= m["mel/pairs"]
        assert m["mel/validated"] + m["mel/rejected"] == m["mel/candidates"]
        assert math.isfinite(m["loss"]) and m["time/mel"] >= 0
    pairs = sum(m["mel/pairs"] for m in result.metrics)
    assert pairs > 0, "no group of 4 rollouts had both outcomes in 3 steps: MEL had nothing to contrast"
    with transaction(db) as session:
        history = meta_repo.history(session, result.run_id)
        yields = meta_repo.step_yield(session, result.run_id)
    assert len(history) == pairs and [y.step for y in yields] == [1, 2, 3]
    assert [y.pairs for y in yields] == [m["mel/pairs"] for m in result.metrics]
    for row in history:  # real diagnoses: whatever the model wrote is kept; the provenance is whole
        assert row.positive_attempt_id != row.negative_attempt_id and row.bifurcation_step >= 1
        assert row.located_by in ("model", "heuristic") and isinstance(row.diagnosis, str)
        if row.experience_id is not None:
            assert row.replays == 2 and row.verdict in ("validated", "rejected") and row.meta_experience
    with db.connect() as conn:
        replays = conn.execute(sa.text("SELECT count(*) FROM rollout_groups WHERE mode = 'replay'")).scalar()
    assert replays == sum(m["mel/candidates"] for m in result.metrics)
    print({s.step: (s.qualifying_groups, s.pairs, s.candidates, s.validated) for s in yields})  # the yield, for -s
