"""The CLI's options take their defaults from the config dataclasses: a default written once cannot drift."""

from __future__ import annotations

import click
import pytest

from lanpo.cli import infer, pool, relevance, retrieve, worker
from lanpo.config import field_default
from lanpo.feedback.config import FeedbackConfig, InterConfig
from lanpo.inference.config import EvalConfig, RetrievalSettings, SamplingSettings
from lanpo.retrieval.search import SearchParams
from lanpo.train.config import WorkersConfig


def option(command: click.Command, name: str) -> click.Parameter:
    return next(p for p in command.params if p.name == name)


CASES = [
    (pool.command.commands["sample"], "k", FeedbackConfig, "k"),
    (worker.command, "threads", WorkersConfig, "threads"),
    (pool.command.commands["sample"], "candidates", FeedbackConfig, "candidates"),
    (pool.command.commands["sample"], "gamma", InterConfig, "gamma"),
    (pool.command.commands["context"], "k", FeedbackConfig, "k"),
    (pool.command.commands["context"], "candidates", FeedbackConfig, "candidates"),
    (retrieve.command, "stage1", SearchParams, "stage1"),
    (retrieve.command, "top_k", RetrievalSettings, "top_k"),
    (retrieve.command, "gamma", RetrievalSettings, "gamma"),
    (retrieve.command, "m", RetrievalSettings, "m"),
    (retrieve.command, "ef_search", SearchParams, "ef_search"),
    (relevance.command.commands["build"], "top_k", RetrievalSettings, "top_k"),
    (relevance.command.commands["build"], "ef_search", SearchParams, "ef_search"),
    (relevance.command.commands["status"], "gamma", InterConfig, "gamma"),
    *[(infer.command, f, RetrievalSettings, f) for f in ("stage1", "top_k", "gamma", "m", "judge")],
    (infer.command, "pool_name", RetrievalSettings, "pool"),
    *[(infer.command, f, SamplingSettings, f) for f in ("max_new_tokens", "temperature", "top_p", "seed")],
    *[(infer.command, f, EvalConfig, f) for f in ("model", "batch_size", "backend", "dtype", "device", "run_name")],
]


@pytest.mark.parametrize(("command", "name", "cls", "field"), CASES, ids=[f"{c[0].name}-{c[1]}" for c in CASES])
def test_option_default_is_the_dataclass_default(command: click.Command, name: str, cls: type, field: str) -> None:
    assert option(command, name).default == field_default(cls, field)


def test_pool_sample_draws_as_the_trainer_does() -> None:
    sample = pool.command.commands["sample"]
    trainer = FeedbackConfig()
    assert (option(sample, "k").default, option(sample, "candidates").default) == (trainer.k, trainer.candidates)


def test_every_infer_option_is_explained() -> None:
    assert all(isinstance(p, click.Option) and p.help for p in infer.command.params)
