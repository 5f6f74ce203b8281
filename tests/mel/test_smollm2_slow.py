"""MEL end to end on the real SmolLM2-135M: SFT warm start, then MEL steps whose rollouts, diagnoses, replays and
NLL term are the real model's, recorded in the store with complete provenance.

A 135M model after a short warm start is right a few times in a hundred, so two steps of two groups may hold no
group with both outcomes and MEL nothing to contrast. So that the test always exercises MEL, each rollout group's
first completion is replaced by a written-out correct solution (`GoldFirst`): every group then has a correct
rollout, and its incorrect ones are the model's own. Diagnoses and replays are untouched model generations.

Two MEL steps (the second on the weights the first's NLL term updated) and two SFT steps: what a third step or
five more SFT steps ran again proved nothing more here (no assertion reads the SFT's effect: `GoldFirst` makes
every group qualify), and SFT on SmolLM2 handing its adapter to RL is tests/train/test_smollm2_slow.py's.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo import meta as meta_repo
from lanpo.mel.config import MELConfig
from lanpo.rollout import Completion, SamplingParams
from lanpo.train import state
from lanpo.train.config import DataConfig, FeedbackConfig, GRPOConfig, ModelConfig, RolloutConfig, SFTConfig
from lanpo.train.loop import train
from lanpo.train.producer.served_policy import ServedPolicy
from tests.train.conftest import tiny_config

pytestmark = pytest.mark.slow


class GoldFirst:
    """The real backend, except that a training rollout group's first completion is a correct solution. It sits
    under the run's `ServedPolicy`, which still checks every completion's served adapter."""

    def __init__(self, backend: Any, tokenizer: Any, answers: dict[str, str]) -> None:
        self.backend, self.tokenizer, self.answers = backend, tokenizer, answers

    def __getattr__(self, name: str) -> Any:  # served_adapter_sha256, next_token_logprobs, ... of the backend
        return getattr(self.backend, name)

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        groups = self.backend.generate(prompts, n, params)
        for prompt, group in zip(prompts, groups, strict=True):
            if "Attempt A is correct" in prompt or "A lesson from earlier work" in prompt:
                continue  # diagnoses and replays: the model's own
            question = next(q for q in self.answers if q in prompt)
            answer = self.answers[question]
            text = f"{question.split(':')[-1].strip()} {answer}\nThe answer is \\boxed{{{answer}}}"
            ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id)
            # replace, not a new Completion: the provenance fields (prompt tokens, served adapter) stay the real ones;
            # the engine's log-probs were of the replaced tokens
            group[0] = dataclasses.replace(group[0], text=text, token_ids=ids, finish_reason="stop", logprobs=None)
        return groups


# The full lane (bash .ci/run --full): 111 s on the slowest 2-core machine. Its twin in the main lane,
# tests/mel/test_loop.py::test_mel_steps_write_complete_provenance, runs the same loop (pairs, diagnoses, replays,
# verdicts, the NLL term) on the tiny model and asserts the same provenance, so a defect of MEL's recording or
# counting fails both; what only this test reads is the real model's own text in the diagnoses.
@pytest.mark.full
@pytest.mark.long("MEL on the real 135M model: SFT, then diagnoses, replays and the NLL term of two real steps")
def test_mel_steps_on_smollm2(db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    real = state.open_served_policy

    def open_served_policy(cfg: Any, model: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> ServedPolicy:
        with db.connect() as conn:
            answers = dict(
                conn.execute(
                    sa.text("SELECT question, answer FROM problems WHERE dataset = :d"), {"d": "slow_mel_chain_sum"}
                ).all()
            )
        engine = real(cfg, model, tokenizer, *args, **kwargs)
        engine.backend = GoldFirst(engine.backend, tokenizer, answers)
        return engine

    monkeypatch.setattr(state, "open_served_policy", open_served_policy)
    cfg = tiny_config(
        tmp_path,
        run_name="mel-smollm2-slow",
        method="mel",
        steps=2,
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
            max_steps=2,
            batch_size=4,
            n_problems=16,
            skill_problems=4,
            max_length=384,
            learning_rate=5e-4,
        ),
        mel=MELConfig(pairs_per_problem=1, replays=2, diagnosis_max_new_tokens=64, validation="any_success"),
    )
    result = train(cfg, db=db, progress=False)
    assert result.steps == [1, 2]
    for m in result.metrics:
        assert m["mel/pairs"] <= m["mel/groups/qualifying"] and m["mel/candidates"] <= m["mel/pairs"]
        assert m["mel/validated"] + m["mel/rejected"] == m["mel/candidates"]
        assert math.isfinite(m["loss"]) and m["time/mel"] >= 0
    pairs = sum(m["mel/pairs"] for m in result.metrics)
    assert pairs > 0 and all(m["mel/groups/qualifying"] >= 1 for m in result.metrics)
    with transaction(db) as session:
        history = meta_repo.history(session, result.run_id)
        yields = meta_repo.step_yield(session, result.run_id)
    assert len(history) == pairs and [y.step for y in yields] == [1, 2]
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
