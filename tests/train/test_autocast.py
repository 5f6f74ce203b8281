"""`grpo.autocast = "bf16"`: the trainer's forwards (reference, update, old log-probs, MEL's NLL) run under
`torch.autocast` bf16 with fp32 weights, the log-softmax in fp32. The log-probs must be float32, near fp32's (bf16
rounding of the matmuls, not of the log-softmax) and not identical to them (autocast did run); shared prompts and
whole rows must still agree; the LoRA gradient must point where fp32's does; and the KL must be 0 at the first
update (exactly for LoRA, to rounding for a full copy), the reference running under the same autocast as the
policy. Batches are shaped as a training step writes them (`tests/train/test_shared_prompts.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy.engine import Engine

from lanpo.errors import ConfigError
from lanpo.models import default_device, tiny_causal_lm
from lanpo.rl.advantages import group_advantages
from lanpo.train.config import GRPOConfig
from lanpo.train.consumer.update import NLLTerm, micro_batch_loss, update_policy, warmup_schedule
from lanpo.train.forward import logprobs as logprobs_module
from lanpo.train.forward.batch import autocast_dtype, build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs, completion_logprobs
from lanpo.train.loop import train
from lanpo.train.policy import FullPolicy, LoraPolicy
from tests.mel import nll_workers
from tests.numerics import assert_rounding_close, kl_rounding_bound, misaligned_copy
from tests.train import multirank_workers as w
from tests.train.test_full_ft import _alternating_rewards, _full_config
from tests.train.test_shared_prompts import _lora_model, _step_batch
from tests.train.test_start import _sft_config

BF16 = torch.bfloat16
# Measured on the tiny random model and `_step_batch()` (4 prompts x 4 rows): bf16 autocast against fp32, max
# |diff| 2.3e-3 and mean 5.5e-4 over the completion tokens (shared prompts; 2.0e-3 / 5.2e-4 rows whole). A log-softmax
# run in bf16 on the same bf16 logits is off by max 2.8e-2, mean 1.0e-2: five times the mean bound below.
MAX_DIFF, MEAN_DIFF = 1e-2, 2e-3


def _record_autocast(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype | None]:
    """The `autocast` every trainer forward is asked for (`forward_precision`, as `lanpo.train.forward.logprobs`
    calls it)."""
    seen: list[torch.dtype | None] = []
    real = logprobs_module.forward_precision

    def recording(batch: Any, autocast: torch.dtype | None) -> Any:
        seen.append(autocast)
        return real(batch, autocast)

    monkeypatch.setattr(logprobs_module, "forward_precision", recording)
    return seen


class LogitDtypes:
    """The dtype of every logits tensor the model's head writes: bf16 when a forward ran under autocast."""

    def __init__(self, model: Any) -> None:
        self.seen: list[torch.dtype] = []
        model.get_output_embeddings().register_forward_hook(lambda _m, _a, out: self.seen.append(out.dtype))


def test_autocast_maps_the_setting_and_the_config_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert autocast_dtype("off") is None and autocast_dtype("bf16") is BF16
    assert GRPOConfig().autocast == "off"
    with pytest.raises(ConfigError, match=r"grpo\.autocast must be off, bf16 or auto, got 'fp8'"):
        GRPOConfig(autocast="fp8")
    asked: list[torch.device] = []
    for pays, want in ((True, BF16), (False, None)):
        monkeypatch.setattr(
            "lanpo.train.forward.batch.bf16_pays", lambda device, pays=pays: asked.append(device) or pays
        )
        assert autocast_dtype("auto") is want
        assert autocast_dtype("auto", torch.device("meta")) is want
    # measured on the device the forwards run on; without one, on the device the trainer would pick
    assert asked == [default_device(), torch.device("meta")] * 2


def test_bf16_pays_is_measured_and_never_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe times the product itself: oneDNN's flag alone read True on a Xeon where bf16 ran 0.7x fp32."""
    from lanpo.models import device as dev

    dev.bf16_pays.cache_clear()
    monkeypatch.setattr(dev, "native_bf16", lambda device: False)
    assert dev.bf16_pays("cpu") is False  # no timing at all: a reference GEMM is up to 80x slower
    dev.bf16_pays.cache_clear()
    monkeypatch.setattr(dev, "native_bf16", lambda device: True)
    calls: list[tuple[int, ...]] = []
    real_randn = torch.randn
    monkeypatch.setattr(dev.torch, "randn", lambda *shape: calls.append(shape) or real_randn(*shape))
    measured = dev.bf16_pays("cpu")
    assert calls == [(1024, 576), (576, 1536)] and isinstance(measured, bool)
    assert dev.bf16_pays("cpu") is measured and len(calls) == 2  # once per process
    dev.bf16_pays.cache_clear()
    assert dev.bf16_pays("meta") is False
    dev.bf16_pays.cache_clear()


@pytest.mark.parametrize("share", [True, False], ids=["shared-prompts", "rows-whole"])
def test_bf16_log_probs_are_float32_and_close_to_fp32(share: bool) -> None:
    model = _lora_model()
    batch = _step_batch()
    heads = LogitDtypes(model)
    with torch.no_grad():
        want, want_entropy = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=share))
        assert set(heads.seen) == {torch.float32}
        heads.seen.clear()
        got, entropy = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=share, autocast=BF16))
    assert heads.seen and set(heads.seen) == {BF16}  # every forward ran under autocast
    assert got.dtype == entropy.dtype == torch.float32  # type: ignore[union-attr]
    mask = batch.completion_mask.bool()
    diff = (got - want)[mask].abs()
    assert not torch.equal(got[mask], want[mask])  # autocast took effect
    assert diff.max() < MAX_DIFF and diff.mean() < MEAN_DIFF, (diff.max(), diff.mean())
    assert (entropy - want_entropy)[mask].abs().max() < MAX_DIFF  # type: ignore[operator]


@pytest.mark.parametrize("rows", [slice(None), torch.tensor([15, 4, 5, 6, 7, 12, 13, 14])], ids=["step", "reordered"])
def test_shared_prompts_and_whole_rows_agree_under_autocast(rows: Any) -> None:
    model = _lora_model()
    batch = _step_batch().select(rows)
    with torch.no_grad():
        shared, _ = completion_logprobs(model, batch, logprob_settings=LogprobSettings(autocast=BF16))
        whole, _ = completion_logprobs(
            model, batch, logprob_settings=LogprobSettings(share_prompts=False, autocast=BF16)
        )
    mask = batch.completion_mask.bool()
    diff = (shared - whole)[mask].abs()  # measured: max 1.3e-3, mean 2.4e-4 (fp32: 1e-5)
    assert diff.max() < MAX_DIFF and diff.mean() < MEAN_DIFF, (diff.max(), diff.mean())


def test_the_lora_gradient_under_autocast_points_where_fp32s_does() -> None:
    model = _lora_model()
    batch = _step_batch()
    advantages = group_advantages(torch.randn(batch.size, generator=torch.Generator().manual_seed(3)), 4)
    with LoraPolicy(model).model.disable_adapter(), torch.no_grad():
        ref = completion_logprobs(model, batch)[0]
    results = {}
    for setting in ("off", "bf16"):
        model.zero_grad(set_to_none=True)
        cfg = GRPOConfig(beta=0.05, autocast=setting)
        loss, _, _ = micro_batch_loss(model, batch, advantages, None, ref, None, cfg)
        loss.backward()  # outside autocast, as the update runs it
        grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
        assert all(g is not None and g.dtype == torch.float32 for g in grads)
        results[setting] = (loss.item(), torch.cat([g.flatten() for g in grads]))  # type: ignore[union-attr]
    (loss32, grad32), (loss16, grad16) = results["off"], results["bf16"]
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)
    assert cosine > 0.99 and not torch.equal(grad16, grad32), cosine
    assert 0.9 < float(grad16.norm() / grad32.norm()) < 1.1
    assert abs(loss16 - loss32) < 1e-2


@pytest.mark.parametrize("setting", ["off", "bf16", "auto"])
def test_every_forward_of_an_update_follows_the_setting(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference, old log-probs (two PPO epochs), the update, MEL's NLL forwards, and the measure-only pass
    of a batch without spread. auto, where bf16 pays, is bf16."""
    monkeypatch.setattr("lanpo.train.forward.batch.bf16_pays", lambda device: True)
    model, _ = w.policy()
    prompts, completions, advantages = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    nll = NLLTerm(build_batch(*nll_workers.nll_examples(), 0, torch.device("cpu")), 0.5)
    cfg = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, ppo_epochs=2, micro_batch_size=8, autocast=setting)
    policy = LoraPolicy(model)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate)
    heads = LogitDtypes(model)
    stats = update_policy(policy, optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, 0, nll=nll)
    want = torch.float32 if setting == "off" else BF16
    # ref 4 micro-batches, old log-probs 4, two epochs of 4 GRPO + NLL micro-batches; shared prompts: 2 forwards each
    assert len(heads.seen) >= 16 and set(heads.seen) == {want}
    assert stats.nll is not None and stats.grad_norm > 0
    heads.seen.clear()
    cfg = GRPOConfig(micro_batch_size=8, skip_zero_spread=True, autocast=setting)
    update_policy(policy, optimizer, warmup_schedule(optimizer, 4, 0.0), batch, torch.zeros(batch.size), cfg, 0)
    assert heads.seen and set(heads.seen) == {want}


def test_the_full_reference_is_the_start_to_rounding_under_autocast() -> None:
    prompts, completions, _ = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    policy = FullPolicy(*tiny_causal_lm(seed=0))
    logp = chunked_logprobs(policy.model, batch, LogprobSettings(micro_batch_size=5, autocast=BF16))
    # autocast multiplies fresh bf16 casts of the same weights, so the copies' forwards differ at most by their
    # float32 accumulation (measured bit for bit, the copy misaligned too): held to float32 rounding (~4e-5 here),
    # which a reference run without autocast misses by 60 times (the 2.3e-3 measured beside MAX_DIFF)
    for reference in (policy.reference, misaligned_copy(policy.reference)):
        policy.reference = reference
        assert_rounding_close(
            policy.reference_logprobs(batch, LogprobSettings(micro_batch_size=5, autocast=BF16)), logp, torch.float32
        )
    assert not torch.equal(chunked_logprobs(policy.model, batch, LogprobSettings(micro_batch_size=5)), logp)


def test_kl_is_zero_at_step_1_under_autocast_lora(
    db: Engine,
    toy_problems: list[int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """tests/train/test_start.py's SFT warm start, its forwards under bf16 autocast; on a CPU without native bf16
    (where a bf16 matmul is ~80x slower than fp32) or where it measures no faster, the trainer says so, and only
    there."""
    from lanpo.models import bf16_pays

    monkeypatch.setattr(
        "lanpo.train.producer.produce.grade", _alternating_rewards
    )  # spread in every group: the weights move
    seen = _record_autocast(monkeypatch)
    cfg = _sft_config(tmp_path, steps=2, grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, autocast="bf16"))
    with caplog.at_level("WARNING", logger="lanpo.train.state"):
        first, second = train(cfg, db=db, progress=False).metrics
    warned = [r.getMessage() for r in caplog.records if "measured no faster than fp32" in r.getMessage()]
    assert len(warned) == (0 if bf16_pays("cpu") else 1), warned
    assert seen and set(seen) == {BF16}  # grpo.autocast reached the trainer's forwards
    assert first["autocast/bf16"] == second["autocast/bf16"] == 1.0  # and the run's metrics say so
    # reference = the SFT model = the policy before its first update, same autocast; exactly, by construction:
    # the same weights in the same memory, and the adapter's B = 0 adds exactly 0
    assert first["kl"] == 0.0
    assert first["grad_norm"] > 0 and second["kl"] > 0


def test_kl_is_zero_at_step_1_under_autocast_full(
    db: Engine, toy_problems: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/train/test_full_ft.py's full fine-tuning run from the merged SFT start, under bf16 autocast."""
    monkeypatch.setattr("lanpo.train.producer.produce.grade", _alternating_rewards)
    seen = _record_autocast(monkeypatch)
    cfg = _full_config(tmp_path, grpo=GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, autocast="bf16"))
    first, second = train(cfg, db=db, progress=False).metrics
    assert seen and set(seen) == {BF16}
    assert abs(first["kl"]) <= kl_rounding_bound()  # a copy of the start in memory of its own: 0 to rounding
    assert first["grad_norm"] > 0 and second["kl"] > 0
