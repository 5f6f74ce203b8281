"""Builders for the retrieval tests: a deterministic offline embedder, problems, experiences, a counted tiny judge."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.retrieval.bm25 import tokenize
from lanpo.retrieval.judge import HFJudge


class HashEmbedder:
    """Bag of hashed tokens, L2-normalised: texts sharing words are close. No model, no download."""

    def __init__(self, dim: int = 384, name: str = "hash-test") -> None:
        self.dim, self.name = dim, name
        self.calls = 0

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in tokenize(text) or ["<empty>"]:
                out[row, int(hashlib.md5(token.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


QUESTIONS = [
    "Sam has 5 apples and buys 7 more apples. How many apples does Sam have?",
    "A train travels 60 km per hour for 3 hours. How far does the train travel?",
    "Compute the sum 12 + 30 + 7 + 1.",
    "Solve for x: 3x + 4 = 19.",
    "Lucy has 12 apples and gives 5 apples away. How many apples are left?",
    "A car travels 80 km per hour for 2 hours. How far does the car go?",
    "Compute the sum 4 + 9 + 15.",
    "Solve for y: 2y - 6 = 10.",
]


def make_problems(session: Session, dataset: str = "toy", questions: Sequence[str] = QUESTIONS) -> list[int]:
    upsert_problems(session, dataset, [Question(f"q{i}", q, str(i)) for i, q in enumerate(questions)])
    rows = session.scalars(sa.text("SELECT id FROM problems WHERE dataset = :d ORDER BY id"), {"d": dataset})
    return list(rows)


POOL = "retrieval-test"


def make_experiences(session: Session, items: Sequence[tuple[int, str]], pool: str = POOL) -> list[int]:
    """(problem id, summary) -> version ids of new experiences in `pool` (capacity caps out of the way)."""
    store = StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)
    news = [NewExperience(problem_id, summary, reward=1.0) for problem_id, summary in items]
    return add_experiences(session, ensure_pool(session, pool, store), news).version_ids


def pool_id(session: Session, pool: str = POOL) -> int:
    """The id of the test pool (created, empty, when the test has not filled it)."""
    return ensure_pool(session, pool, StoreConfig(per_problem_cap=10_000, per_step_cap=10_000)).id


def tiny_judge(batch_size: int = 4) -> tuple[HFJudge, list[int]]:
    """A judge on a tiny random causal LM; the list records the batch size of every forward pass that scores
    pairs (a shared-prefix pass, which scores nothing by itself, is not recorded)."""
    from lanpo.models import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0)
    seen: list[int] = []

    def record(_module: object, _args: object, kwargs: dict, _out: object) -> None:
        prefix_only = kwargs.get("use_cache") and kwargs.get("cache") is None and kwargs.get("past_key_values") is None
        if not prefix_only:
            seen.append(int(kwargs["input_ids"].shape[0]))

    model.register_forward_hook(record, with_kwargs=True)
    return HFJudge(model, tokenizer, model_id="tiny", batch_size=batch_size), seen
