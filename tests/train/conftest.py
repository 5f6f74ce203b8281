"""Trainer fixtures: a toy dataset in the store and a tiny-model TrainConfig that runs in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.feedback.config import DataConfig, FeedbackConfig, InterConfig, SummarizerConfig
from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig, RolloutConfig, TrainConfig


@pytest.fixture
def toy_problems(db: Engine) -> list[int]:
    """Six arithmetic problems in dataset `toy`, all relevant to each other under scorer `test`."""
    return insert_toy_problems(db)


def insert_toy_problems(db: Engine) -> list[int]:
    """`toy_problems`' rows, for a test that empties the store and fills it again."""
    rows = [Question(external_id=str(i), question=f"What is {i} + {i + 1}?", answer=str(2 * i + 1)) for i in range(6)]
    with transaction(db) as session:
        upsert_problems(session, "toy", rows)
        ids = problem_ids(session, "toy")
        session.connection().exec_driver_sql(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            "SELECT a.id, b.id, 'test', 0.95 FROM problems a JOIN problems b ON a.id <> b.id"
        )
    return ids


def tiny_config(tmp_path: Path, **overrides: object) -> TrainConfig:
    """Tiny random model, 3 problems x 2 rollouts, every problem with feedback when the store has some."""
    values: dict[str, object] = {
        "run_name": "tiny",
        "steps": 3,
        "batch_size": 3,
        "seed": 0,
        "output_dir": str(tmp_path / "ckpt"),
        "model": ModelConfig(name="tiny-random", threads=1),
        "lora": LoraConfig(r=4, alpha=8),
        "data": DataConfig(dataset="toy"),
        "rollout": RolloutConfig(n=2, max_new_tokens=24),
        "grpo": GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0),
        "feedback": FeedbackConfig(
            mode="both", p_t=1.0, k=2, candidates=4, inter=InterConfig(gamma=0.5, scorer="test")
        ),
        # A random model never writes the lesson's three headers: its summaries are admitted as they are, so the
        # pool fills and inter contexts get drawn (tests/train/test_summary_admission.py covers the default).
        "summarizer": SummarizerConfig(
            min_reward=0.0, max_new_tokens=32, max_new_per_step=2, temperature=1.0, require_format=False
        ),
    }
    values.update(overrides)
    return TrainConfig(**values)  # type: ignore[arg-type]
