"""The step's cost/* metrics: every generated token and every prompt token, by source, counted exactly.

A real tiny step with summaries on, against the lengths of what the engine returned to every generation call of the
step (recorded around the real backend, not replaced); and MEL's diagnoses and replays by hand on the records a
MEL step hands to rank 0 (a random tiny model never gets a group with both a right and a wrong answer, so MEL
generates nothing in a real tiny run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.feedback.record import GroupRecord, MetaRecord, RolloutRecord, cost_metrics
from lanpo.rollout import Completion, SamplingParams
from lanpo.train.loop import grpo_step
from lanpo.train.state import setup
from tests.train.conftest import tiny_config


def _record_calls(backend: Any, calls: list[tuple[int, list[Completion]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generate call of `backend`: (max_new_tokens, the completions it returned), the real call unchanged."""
    real = backend.generate

    def generate(prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        out = real(prompts, n, params)
        calls.append((params.max_new_tokens, [c for group in out for c in group]))
        return out

    monkeypatch.setattr(backend, "generate", generate)


def test_a_tiny_step_counts_every_generated_token(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generated = the completion lengths of the rollouts + the summaries, exactly; prompts apart; committed with
    the step's metrics."""
    cfg = tiny_config(tmp_path, steps=1)  # rollouts of 24 new tokens at most, summaries of 32: told apart by that
    trainer, start = setup(cfg, db, resume=False)
    calls: list[tuple[int, list[Completion]]] = []
    try:
        _record_calls(trainer.backend, calls, monkeypatch)
        assert trainer.summarizer is not None
        if trainer.summarizer.backend is not trainer.backend:
            _record_calls(trainer.summarizer.backend, calls, monkeypatch)
        metrics = grpo_step(trainer, start)
    finally:
        trainer.backend.close()
    by_kind: dict[int, list[Completion]] = {}
    for budget, completions in calls:
        by_kind.setdefault(budget, []).extend(completions)
    assert set(by_kind) == {cfg.rollout.max_new_tokens, cfg.summarizer.max_new_tokens}
    rollouts, summaries = by_kind[cfg.rollout.max_new_tokens], by_kind[cfg.summarizer.max_new_tokens]
    assert len(rollouts) == cfg.batch_size * cfg.rollout.n and summaries
    hand = {
        "cost/generated_tokens/rollout": sum(len(c.token_ids) for c in rollouts),
        "cost/generated_tokens/summary": sum(len(c.token_ids) for c in summaries),
        "cost/prompt_tokens/rollout": sum(len(c.prompt_token_ids) for c in rollouts),
        "cost/prompt_tokens/summary": sum(len(c.prompt_token_ids) for c in summaries),
    }
    hand["cost/generated_tokens"] = hand["cost/generated_tokens/rollout"] + hand["cost/generated_tokens/summary"]
    hand["cost/prompt_tokens"] = hand["cost/prompt_tokens/rollout"] + hand["cost/prompt_tokens/summary"]
    for name, value in hand.items():
        assert metrics[name] == value, name
    assert metrics["cost/generated_tokens/mel_diagnosis"] == metrics["cost/generated_tokens/mel_replay"] == 0.0
    with db.connect() as conn:  # written with the step: in run_metrics of a committed step
        stored = dict(
            conn.execute(
                sa.text(
                    "SELECT m.name, m.value FROM run_metrics m JOIN run_steps c "
                    "ON c.run_id = m.run_id AND c.step = m.step WHERE m.run_id = :r AND m.name LIKE 'cost/%'"
                ),
                {"r": trainer.run_id},
            ).all()
        )
    assert {name: stored[name] for name in hand} == hand


def test_mel_diagnoses_and_replays_by_hand() -> None:
    """A group of 2 rollouts (5 + 7 tokens, prompt 10), one summarised (gen 9, read 30), two diagnosed pairs (gen 11
    and 13, prompts 40 and 41) of which one was replayed 3 times (4 + 5 + 6 tokens, prompt 20 each)."""

    def rollout(tokens: int, **summary: Any) -> RolloutRecord:
        return RolloutRecord("r", 0.0, False, False, tokens, False, **summary)

    def pair(tokens: int, prompt: int, replays: list[int]) -> MetaRecord:
        return MetaRecord(
            0, 1, "lines", 1, 0, "model", "d", 0.5, diagnosis_tokens=tokens, diagnosis_prompt_tokens=prompt,
            replay_prompt_tokens=20 if replays else 0, replays=[rollout(t) for t in replays],
        )  # fmt: skip

    group = GroupRecord(
        1, "zero_shot", "p", 10, [],
        [rollout(5, summary_generated_tokens=9, summary_prompt_tokens=30), rollout(7)],
        meta=[pair(11, 40, [4, 5, 6]), pair(13, 41, [])],
    )  # fmt: skip
    got = cost_metrics([group])
    assert got == {
        "cost/generated_tokens": 5 + 7 + 9 + 11 + 13 + 4 + 5 + 6,
        "cost/prompt_tokens": 2 * 10 + 30 + 40 + 41 + 3 * 20,
        "cost/generated_tokens/rollout": 12,
        "cost/prompt_tokens/rollout": 20,
        "cost/generated_tokens/summary": 9,
        "cost/prompt_tokens/summary": 30,
        "cost/generated_tokens/mel_diagnosis": 24,
        "cost/prompt_tokens/mel_diagnosis": 81,
        "cost/generated_tokens/mel_replay": 15,
        "cost/prompt_tokens/mel_replay": 60,
    }
