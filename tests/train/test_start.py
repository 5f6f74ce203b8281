"""RL starts from the SFT model: the start adapter is merged into the base, RL trains a fresh adapter on top, the
reference is the SFT model (KL exactly 0 at step 1), and a checkpoint's adapter loads back onto the same start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy.engine import Engine

from lanpo.train.config import FeedbackConfig, SFTConfig
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.loop import train
from lanpo.train.sft.warm_start import write_pairs
from tests.train.conftest import tiny_config

PAIRS = [
    {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": f"{a + b}"}]}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]
]


def _sft_config(tmp_path: Path, **overrides: object):  # type: ignore[no-untyped-def]
    data = tmp_path / "pairs.jsonl"
    write_pairs(PAIRS, data)
    values = {
        "steps": 1,
        "sft": SFTConfig(enabled=True, data=str(data), learning_rate=5e-2, max_steps=3, batch_size=2, max_length=64),
        "feedback": FeedbackConfig(mode="none"),
        **overrides,
    }
    return tiny_config(tmp_path, **values)


def test_kl_is_zero_at_step_1_after_an_sft_warm_start(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    result = train(_sft_config(tmp_path), db=db, progress=False)
    # reference = the SFT model = the policy before its first update; exactly, by construction: the adapter
    # disabled is the same weights in the same memory, and a fresh adapter's B = 0 adds exactly 0
    assert result.metrics[0]["kl"] == 0.0
    start = json.loads((result.checkpoint_dir / "start.json").read_text())
    assert start["adapter"] == str((result.checkpoint_dir / "sft" / "adapter").resolve())
    assert len(start["adapter_sha256"]) == 64
    # every checkpoint's adapter names the start it was trained on
    step_adapter = result.checkpoint_dir / "step-000001" / "adapter"
    assert json.loads((step_adapter / "lanpo_start.json").read_text()) == start


def test_a_finished_sft_adapter_as_init_adapter_starts_the_same_way(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    first = train(_sft_config(tmp_path / "a", run_name="with-sft"), db=db, progress=False)
    sft_adapter = first.checkpoint_dir / "sft" / "adapter"
    cfg = _sft_config(tmp_path / "b", run_name="from-adapter", sft=SFTConfig(enabled=False))
    cfg.model.init_adapter = str(sft_adapter)
    second = train(cfg, db=db, progress=False)
    assert second.metrics[0]["kl"] == 0.0
    assert json.loads((second.checkpoint_dir / "start.json").read_text())["adapter"] == str(sft_adapter.resolve())


def test_a_checkpoint_adapter_loads_onto_its_start(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    """The answerer rebuilds base + merged SFT start + RL adapter: the same log-probs as the trainer."""
    from lanpo.inference.answerer import Answerer
    from lanpo.models import load_adapter, tiny_causal_lm
    from lanpo.train.state import setup

    cfg = _sft_config(tmp_path, steps=2)
    train(cfg, db=db, progress=False)
    cfg.steps = 2
    trainer, _ = setup(cfg, db, resume=True)  # the trained policy, resumed from the database's last step
    adapter = trainer.checkpoint_root / "step-000002" / "adapter"
    model, tokenizer = tiny_causal_lm(seed=cfg.seed)
    answerer = Answerer(model, adapter=adapter, tokenizer=tokenizer)
    batch = build_batch([[5, 6, 7, 8]], [[9, 10, 11]], 0, torch.device("cpu"))
    with torch.no_grad():
        want, _ = completion_logprobs(trainer.policy.model, batch)
        got, _ = completion_logprobs(answerer.model, batch)
        plain, _ = completion_logprobs(load_adapter(tiny_causal_lm(seed=cfg.seed)[0], adapter), batch)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(plain, want, atol=1e-5)  # the RL adapter alone, on the raw base, is another policy
    assert answerer.start_sha256 == json.loads((trainer.checkpoint_root / "start.json").read_text())["adapter_sha256"]


def test_a_changed_start_adapter_is_refused_on_resume(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    from lanpo.errors import InputError
    from lanpo.models import load_adapter, tiny_causal_lm

    cfg = _sft_config(tmp_path)
    result = train(cfg, db=db, progress=False)
    sft_adapter = result.checkpoint_dir / "sft" / "adapter"
    changed = load_adapter(tiny_causal_lm(seed=0)[0], sft_adapter, trainable=True)
    with torch.no_grad():
        for name, p in changed.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    changed.save_pretrained(sft_adapter)
    cfg.steps = 2
    with pytest.raises(InputError, match="changed since this run started from it"):
        train(cfg, db=db, resume=True, progress=False)
