"""`[replay]` in lanpo's trainer, end to end on a tiny random model against the real store: the tokens and behaviour
log-probs it keeps are the sampling policy's, replayed rows are written as replays and never as fresh rollouts, a
run with replay off is the run without the feature bit for bit, and the update with replayed rows is the same at
any micro-batch size (at several ranks and minibatches: tests/train/test_replay_ranks.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.feedback.config import FeedbackConfig
from lanpo.feedback.replay_config import ReplayConfig
from lanpo.rewards import Graded
from lanpo.train.config import GRPOConfig, TrainConfig
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.loop import grpo_step, train
from lanpo.train.state import setup
from tests.train.conftest import tiny_config

NO_FEEDBACK = FeedbackConfig(mode="none", p_t=0.0)


def _alternating(completions: list[str], answers: list, modes: list, format_rule: str = "") -> list[Graded]:
    """Every other rollout right: spread in every group (the tiny random model never answers right), successes to
    replay, and an update that moves the weights."""
    return [Graded(float(i % 2), bool(i % 2), False) for i in range(len(completions))]


@pytest.fixture(autouse=True)
def _rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lanpo.train.producer.produce.grade", _alternating)


def _rows(db: Engine, sql: str, **params: object) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def _config(tmp_path: Path, name: str, replay: ReplayConfig, **overrides: object) -> TrainConfig:
    values: dict[str, object] = {"run_name": name, "feedback": NO_FEEDBACK, "method": "grpo", "replay": replay}
    values.update(overrides)
    return tiny_config(tmp_path / name, **values)


def test_the_kept_log_probs_are_the_sampling_policys_and_not_the_updated_ones(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    cfg = _config(
        tmp_path,
        "keep",
        ReplayConfig(keep_tokens=True, successes_only=False),
        steps=1,
        grpo=GRPOConfig(learning_rate=5e-2, warmup_ratio=0.0),
    )
    t, start = setup(cfg, db, False)
    before = {k: v.detach().clone() for k, v in t.policy.model.state_dict().items()}
    grpo_step(t, start)
    stored = _rows(
        db,
        "SELECT g.prompt, k.token_ids, k.logprobs, k.logprobs_of, a.response FROM attempt_tokens k "
        "JOIN attempts a ON a.id = k.attempt_id JOIN rollout_groups g ON g.id = a.group_id "
        "WHERE g.run_id = :r ORDER BY a.id",
        r=t.run_id,
    )
    assert len(stored) == cfg.batch_size * cfg.rollout.n  # every zero-shot rollout, successes_only = false
    assert {row[3] for row in stored} == {"trainer"}  # the hf backend: the trainer's pass before the update
    assert all(t.tokenizer.decode(row[1], skip_special_tokens=True) == row[4] for row in stored)

    def logprobs_now() -> list[torch.Tensor]:
        prompt_ids = [t.tokenizer.encode(row[0], add_special_tokens=False) for row in stored]
        batch = build_batch(prompt_ids, [row[1] for row in stored], t.tokenizer.pad_token_id, t.device)
        with torch.no_grad():
            logp, _ = completion_logprobs(
                t.policy.model, batch, logprob_settings=LogprobSettings(temperature=cfg.rollout.temperature)
            )
        return [logp[b, : len(row[1])] for b, row in enumerate(stored)]

    after = logprobs_now()
    t.policy.model.load_state_dict(before)
    sampler = logprobs_now()
    kept = [torch.tensor(row[2]) for row in stored]
    assert all(torch.allclose(k, s, atol=1e-5) for k, s in zip(kept, sampler, strict=True))
    assert max(float((k - a).abs().max()) for k, a in zip(kept, after, strict=True)) > 1e-3  # the update moved them


def _run_rows(db: Engine, run_id: int) -> tuple[list[tuple], list[tuple]]:
    attempts = _rows(
        db,
        "SELECT a.id, g.step, g.mode, a.response, a.reward FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
        "WHERE g.run_id = :r ORDER BY a.id",
        r=run_id,
    )
    shas = _rows(db, "SELECT step, adapter_sha256 FROM policy_versions WHERE run_id = :r ORDER BY step", r=run_id)
    return attempts, shas


def test_replay_off_and_keeping_tokens_train_bit_for_bit_as_the_run_without_the_feature(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    plain = train(_config(tmp_path, "plain", ReplayConfig()), db=db, progress=False)
    keep = train(
        _config(tmp_path, "keeping", ReplayConfig(keep_tokens=True, successes_only=False)), db=db, progress=False
    )
    a_rows, a_shas = _run_rows(db, plain.run_id)
    b_rows, b_shas = _run_rows(db, keep.run_id)
    offset = b_rows[0][0] - a_rows[0][0]  # the second run's ids follow the first's, one for one
    assert [(i + offset, *rest) for i, *rest in a_rows] == b_rows
    assert [sha for _, sha in a_shas] == [sha for _, sha in b_shas]
    assert _rows(
        db,
        "SELECT count(*) FROM attempt_tokens k JOIN attempts a ON a.id = k.attempt_id "
        "JOIN rollout_groups g ON g.id = a.group_id WHERE g.run_id = :r",
        r=plain.run_id,
    ) == [(0,)]


@pytest.mark.parametrize("correction", ["none", "shaped", "separate"])
def test_replayed_rows_are_written_as_replays_of_earlier_zero_shot_attempts(
    db: Engine, toy_problems: list[int], tmp_path: Path, correction: str
) -> None:
    replay = ReplayConfig(enabled=True, correction=correction, per_group=2, successes_only=False)
    result = train(_config(tmp_path, f"replay-{correction}", replay), db=db, progress=False)
    run = result.run_id
    replays = _rows(
        db,
        "SELECT g.step, g.problem_id, a.response, a.reward, s.step, sg.problem_id, sg.mode, sa.response, sa.reward, "
        "sg.run_id FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
        "JOIN attempts sa ON sa.id = a.replay_of JOIN rollout_groups sg ON sg.id = sa.group_id "
        "JOIN LATERAL (SELECT sg.step) s ON true WHERE g.run_id = :r AND g.mode = 'replayed'",
        r=run,
    )
    assert replays, "steps 2 and 3 have earlier zero-shot attempts of their problems to replay"
    for step, pid, response, reward, src_step, src_pid, src_mode, src_response, src_reward, src_run in replays:
        assert src_run == run and src_step < step and src_pid == pid and src_mode == "zero_shot"
        assert (response, reward) == (src_response, src_reward)
    per_group = _rows(
        db,
        "SELECT count(*) FROM attempts a JOIN rollout_groups g ON g.id = a.group_id "
        "WHERE g.run_id = :r AND g.mode = 'replayed' GROUP BY g.id",
        r=run,
    )
    assert max(n for (n,) in per_group) <= 2
    # fresh rollouts are counted as they always were; the replayed rows only under replay/*
    assert sum(m["replay/count"] for m in result.metrics) == len(replays) > 0
    assert result.metrics[0]["replay/count"] == 0  # step 1 has nothing earlier to replay
    replayed = [m for m in result.metrics if m["replay/count"] > 0]
    # only the shaped correction weighs replayed tokens by w / (w + 0.1): the others write no shaped_mean at all
    assert all(("replay/shaped_mean" in m) == (correction == "shaped") for m in replayed), correction
    for metrics in result.metrics:
        assert metrics["count/zero_shot"] == 3 * 2
        assert metrics["cost/generated_tokens/rollout"] == metrics["tokens/completion"]
        assert metrics["cost/trained_tokens"] == metrics["tokens/completion"] + metrics["cost/trained_tokens/replay"]
    by_mode = dict(_rows(db, "SELECT mode, count(*) FROM run_attempts WHERE run_id = :r GROUP BY mode", r=run))
    assert by_mode.get("zero_shot") == 3 * 3 * 2


def test_the_update_with_replayed_rows_is_the_same_at_any_micro_batch_size(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """Separate terms weigh each micro-batch by its minibatch's fresh and replayed token counts: one row per
    micro-batch must give the update of the whole batch at once."""
    weights = []
    for micro in (1, 64):
        replay = ReplayConfig(enabled=True, correction="separate", per_group=2, successes_only=False)
        grpo = GRPOConfig(learning_rate=1e-2, warmup_ratio=0.0, micro_batch_size=micro)
        cfg = _config(tmp_path, f"micro-{micro}", replay, grpo=grpo, steps=2, batch_size=6)  # every problem each step
        t, start = setup(cfg, db, False)
        metrics = [grpo_step(t, step) for step in (start, start + 1)]
        assert metrics[1]["replay/count"] > 0 and metrics[1]["replay/ratio_mean"] > 0
        assert "replay/shaped_mean" not in metrics[1]  # separate terms shape nothing: no 0 that reads as a weight
        weights.append([p.detach().clone() for p in t.policy.trainable_parameters()])
    moved = max(float((a - b).abs().max()) for a, b in zip(*weights, strict=True))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*weights, strict=True)), moved


def test_replay_refuses_what_it_does_not_run_on(tmp_path: Path) -> None:
    """Several minibatches and LoRA ranks run (tests/train/test_replay_ranks.py); full fine-tuning on several ranks
    (FSDP's collective forwards) and rollout workers do not."""
    from lanpo.errors import ConfigError
    from lanpo.train.config import LoraConfig, WorkersConfig

    _config(tmp_path, "mb", ReplayConfig(enabled=True), batch_size=4, grpo=GRPOConfig(minibatch_size=4)).check_world(2)
    with pytest.raises(ConfigError, match="successes alone"):
        ReplayConfig(enabled=True, correction="separate")
    cfg = _config(tmp_path, "ok", ReplayConfig(enabled=True), batch_size=4)
    cfg.check_world(2)
    full = dataclasses.replace(cfg, lora=LoraConfig(enabled=False))
    full.check_world(1)
    with pytest.raises(ConfigError, match="full fine-tuning runs in one process"):
        full.check_world(2)
    with pytest.raises(ConfigError, match="rollout workers"):
        _config(tmp_path, "workers", ReplayConfig(keep_tokens=True), workers=WorkersConfig(count=1)).check_world(1)
    assert dataclasses.replace(cfg.replay, enabled=False).stores_tokens is False


def test_an_earlier_runs_kept_successes_are_replayed_and_another_temperature_is_refused(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """RLEP's fixed pool: a run that kept its tokens (`replay.keep_tokens`) is replayed by a later one
    (`replay.source_runs`), every step of it; a pool sampled at another temperature is refused where the correction
    reads its log-probs."""
    earlier = train(
        _config(tmp_path, "pool", ReplayConfig(keep_tokens=True), steps=1, batch_size=6), db=db, progress=False
    )
    later = _config(tmp_path, "rlep", ReplayConfig(enabled=True, source_runs=["pool"]), steps=1, batch_size=6)
    result = train(later, db=db, progress=False)
    sources = _rows(db, "SELECT DISTINCT source_run_id, age FROM replays WHERE run_id = :r", r=result.run_id)
    assert sources == [(earlier.run_id, 0)]  # step 1 of the later run replays step 1 of the pool
    # every problem: the pool's one success (every other rollout right), though per_group asks for 2
    assert result.metrics[0]["replay/count"] == 6 and result.metrics[0]["replay/accuracy"] == 1.0
    from lanpo.errors import ConfigError

    hotter = _config(tmp_path, "hot", ReplayConfig(enabled=True, correction="shaped", source_runs=["pool"]), steps=1)
    hotter = dataclasses.replace(hotter, rollout=dataclasses.replace(hotter.rollout, temperature=0.7))
    with pytest.raises(ConfigError, match="another distribution"):
        train(hotter, db=db, progress=False)
