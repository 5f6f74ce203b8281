"""Fixtures for the inference tests: a tiny random policy, an answerer on it, a scripted backend, a small pool."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.inference.answerer import Answerer
from lanpo.inference.config import RetrievalSettings, SamplingSettings
from lanpo.models import tiny_causal_lm
from lanpo.rollout import Completion, SamplingParams

TOPICS = ("addition", "multiplication", "fractions", "percentages")  # one per pool experience: BM25 tells them apart
EXPERIENCE_REWARD = 0.8137  # distinctive: must never show up in a prompt


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    return tiny_causal_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, tiny: tuple[Any, Any]) -> Path:
    """The tiny model saved as a HF folder, so the CLI can load it by path."""
    path = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = tiny
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def make_answerer(tiny: tuple[Any, Any], db: SAEngine) -> Callable[..., Answerer]:
    """An answerer on the tiny model and the test database; notices collected in `answerer.notes`."""

    def make(**kwargs: Any) -> Answerer:
        notes: list[str] = []
        model, tokenizer = tiny
        kwargs.setdefault("sampling", SamplingSettings(max_new_tokens=8, temperature=1.0, seed=0))
        kwargs.setdefault("retrieval", RetrievalSettings(stage1="bm25", top_k=4, gamma=0.0, m=2, judge="none"))
        answerer = Answerer(model, tokenizer=tokenizer, db=db, batch_size=3, notify=notes.append, **kwargs)
        answerer.notes = notes  # type: ignore[attr-defined]
        return answerer

    return make


def script_answer(prompt: str, sample: int) -> str:
    """What the scripted policy answers: right when (question number + sample) % 3 == 0, else off by one."""
    match = re.search(r"What is (\d+)\+(\d+)\? \(q(\d+)\)", prompt)
    assert match, prompt
    a, b, q = (int(x) for x in match.groups())
    value = a + b if (q + sample) % 3 == 0 else a + b + 1
    return f"Adding gives \\boxed{{{value}}}"


def scripted_expectation(q: int, k: int) -> float:
    return sum((q + j) % 3 == 0 for j in range(k)) / k


class ScriptedBackend:
    """A deterministic stand-in for the *model* (tiny random models never box an answer), so tables are non-trivial.

    Everything else (prompts, grading, storage, counting) is the real code.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.prompts: list[str] = []
        self.params: list[SamplingParams] = []

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        self.prompts.extend(prompts)
        self.params.append(params)
        out = []
        for p in prompts:
            ids = tuple(self.tokenizer.encode(p, add_special_tokens=False))
            group = []
            for j in range(n):
                text = script_answer(p, j)
                group.append(Completion(text, tuple(self.tokenizer.encode(text)), ids, "stop"))
            out.append(group)
        return out


def question_text(a: int, b: int, q: int) -> str:
    return f"What is {a}+{b}? (q{q})"


@pytest.fixture
def pool(session: Session) -> dict[str, Any]:
    """Problems of a `train` dataset with one experience each (reward stored, never shown)."""
    rows = [Question(str(i), question_text(i, i + 1, 100 + i), str(2 * i + 1)) for i in range(4)]
    upsert_problems(session, "train", rows)
    ids = list(session.scalars(sa.text("SELECT id FROM problems ORDER BY id")))
    items = [
        NewExperience(pid, f"A lesson on {topic}: write each step, then check the {topic} result.", EXPERIENCE_REWARD)
        for topic, pid in zip(TOPICS, ids, strict=True)
    ]
    pool = ensure_pool(session, "trained", StoreConfig())
    result = add_experiences(session, pool, items)
    session.commit()
    return {"problem_ids": ids, "version_ids": result.version_ids, "pool": pool}


@pytest.fixture
def committed(db: SAEngine) -> Callable[[], Session]:
    """A context manager factory for one committed transaction on the test database."""
    return lambda: transaction(db)
