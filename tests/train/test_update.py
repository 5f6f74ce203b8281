"""One GRPO update on a tiny random model: LoRA weights move, base weights do not; batching, schedule, and
gradient checkpointing (LoRA and full fine-tuning)."""

from __future__ import annotations

import itertools

import pytest
import torch

from lanpo.errors import ConfigError
from lanpo.models import apply_chat
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend
from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig
from lanpo.train.consumer.update import update_policy, warmup_schedule
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.policy import LoraPolicy, build_policy, load_base, load_policy
from tests.train import multirank_workers as w


def _rollouts(model, tokenizer, n: int = 4):
    prompts = [apply_chat(tokenizer, [{"role": "user", "content": q}]) for q in ("1+2?", "What is 3*4?")]
    groups = HFBackend(model, tokenizer).generate(prompts, n, SamplingParams(max_new_tokens=6, seed=0))
    return [c for g in groups for c in g]


def test_one_grpo_step_changes_lora_and_not_base() -> None:
    model, tokenizer = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    rollouts = _rollouts(model, tokenizer)
    batch = build_batch(
        [c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts], 0, torch.device("cpu")
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    cfg = GRPOConfig(learning_rate=1e-2, warmup_ratio=0.0, beta=0.01, micro_batch_size=3)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate)
    scheduler = warmup_schedule(optimizer, 10, 0.0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    stats = update_policy(LoraPolicy(model), optimizer, scheduler, batch, advantages, cfg, seed=0)
    assert scheduler.last_epoch == 1 and stats.grad_norm > 0 and stats.zero_spread == 0.5
    changed_lora = [n for n, p in model.named_parameters() if "lora_" in n and not torch.equal(p, before[n])]
    changed_base = [n for n, p in model.named_parameters() if "lora_" not in n and not torch.equal(p, before[n])]
    assert changed_lora, "no LoRA parameter moved"
    assert changed_base == []
    # the reference (adapter disabled) is still the untouched base model
    with model.disable_adapter():
        base_logp, _ = completion_logprobs(model, batch)
    assert torch.allclose(LoraPolicy(model).reference_logprobs(batch, LogprobSettings(micro_batch_size=8)), base_logp)
    assert not torch.allclose(completion_logprobs(model, batch)[0], base_logp)


class CaptureGrad(torch.optim.SGD):
    """An optimizer that records the accumulated gradient instead of stepping."""

    captured: list[torch.Tensor]

    def step(self, closure=None):
        self.captured = [
            *getattr(self, "captured", []),
            torch.cat([p.grad.flatten() for p in self.param_groups[0]["params"]]),
        ]


def test_micro_batching_gives_the_same_gradient_as_one_batch() -> None:
    grads = []
    for micro in (8, 3):
        model, tokenizer = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=1)
        with torch.no_grad():  # B != 0 so A gets a gradient too
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
        rollouts = _rollouts(model, tokenizer)
        ids = [c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts]
        batch = build_batch(*ids, 0, torch.device("cpu"))
        cfg = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, beta=0.01, micro_batch_size=micro)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = CaptureGrad(params, lr=0.0)
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
        update_policy(LoraPolicy(model), optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, seed=0)
        grads.append(optimizer.captured[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_batch_layout_left_pads_prompts_and_right_pads_completions() -> None:
    batch = build_batch([[5, 6, 7], [8]], [[1], [2, 3, 4]], 0, torch.device("cpu"))
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 0, 0], [0, 0, 8, 2, 3, 4]]
    assert batch.completion_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]


def test_cosine_schedule_warms_up_then_decays_to_zero() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_schedule(opt, 10, 0.1)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == 0.5 and lrs[1] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:])) and lrs[-1] < 0.05


def test_constant_schedule_holds_the_peak_after_the_warmup() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_schedule(opt, 10, 0.1, "constant")
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == [0.5] + [1.0] * 9


def test_an_unknown_schedule_is_refused_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match=r"grpo\.lr_schedule"):
        GRPOConfig(lr_schedule="linear")


def test_a_dual_clip_at_or_below_one_is_refused_when_the_config_loads() -> None:
    for bad in (1.0, 0.5):
        with pytest.raises(ConfigError, match=r"grpo\.dual_clip must be > 1") as raised:
            GRPOConfig(dual_clip=bad)
        assert "3.0" in str(raised.value.hint)
    assert GRPOConfig().dual_clip is None and GRPOConfig(dual_clip=3.0).dual_clip == 3.0


def test_the_dual_clip_fraction_is_reported_only_with_a_dual_clip() -> None:
    model, tokenizer = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    rollouts = _rollouts(model, tokenizer)
    batch = build_batch(
        [c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts], 0, torch.device("cpu")
    )
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    metrics = {}
    for dual_clip in (None, 3.0):
        cfg = GRPOConfig(learning_rate=1e-2, warmup_ratio=0.0, ppo_epochs=2, dual_clip=dual_clip)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
        stats = update_policy(
            LoraPolicy(model), optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, 0
        )
        metrics[dual_clip] = stats.as_metrics()
    assert "dual_clip_frac" not in metrics[None]
    assert 0.0 <= metrics[3.0]["dual_clip_frac"] <= 1.0


def test_skip_zero_spread_updates_only_on_signal() -> None:
    model, tokenizer = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    rollouts = _rollouts(model, tokenizer)
    ids = [c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts]
    batch = build_batch(*ids, 0, torch.device("cpu"))
    cfg = GRPOConfig(learning_rate=1e-2, warmup_ratio=0.0, beta=0.01, skip_zero_spread=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate)
    scheduler = warmup_schedule(optimizer, 10, 0.0)
    before = [p.detach().clone() for p in params]
    policy = LoraPolicy(model)
    stats = update_policy(policy, optimizer, scheduler, batch, torch.zeros(8), cfg, seed=0)
    assert stats.zero_spread == 1.0 and stats.kl == stats.kl  # a number, not NaN
    # the measuring passes it still runs are timed (a step that learns nothing is not a free step)
    assert stats.seconds_ref > 0 and stats.seconds_update > 0
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
    assert scheduler.last_epoch == 1
    stats = update_policy(policy, optimizer, scheduler, batch, torch.tensor([1.0, -1.0] + [0.0] * 6), cfg, seed=0)
    assert stats.grad_norm > 0 and stats.zero_spread == 0.75
    assert any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradient(lora: bool) -> None:
    """model.gradient_checkpointing recomputes each layer in backward (it runs twice) and changes no number."""
    prompts, completions, advantages = w.global_rollouts()
    batch = build_batch(prompts, completions, 0, torch.device("cpu"))
    cfg = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, beta=0.1, micro_batch_size=5)
    runs = []
    for checkpointing in (False, True):
        base, tokenizer = load_base(ModelConfig(name="tiny-random", threads=1, gradient_checkpointing=checkpointing))
        policy = build_policy(base, tokenizer, LoraConfig(enabled=lora, r=4, alpha=8), seed=0)
        with torch.no_grad():  # off the start, so the KL term has a gradient too
            for name, p in policy.model.named_parameters():
                if p.requires_grad and (not lora or "lora_B" in name):
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
        # Inside the checkpointed layer forward: the backward's recompute enters it again (and stops early, inside
        # it, once it has what backward needs: a pre-hook sees the second call, a forward hook would not).
        mlp_calls: list[int] = []
        mlp = next(m for m in policy.model.modules() if type(m).__name__ == "LlamaMLP")
        mlp.register_forward_pre_hook(lambda *_, calls=mlp_calls: calls.append(1))
        optimizer = CaptureGrad(policy.trainable_parameters(), lr=0.0)
        stats = update_policy(policy, optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, seed=0)
        runs.append((stats, optimizer.captured[0], len(mlp_calls)))
    (off, grad_off, calls_off), (on, grad_on, calls_on) = runs
    micro_batches = -(-batch.size // cfg.micro_batch_size)
    # With checkpointing each micro-batch runs whole (a checkpointed forward keeps no cache to share prompts from):
    # the update's forward and the same again in backward, and the reference's (LoRA: the same model, adapter off;
    # full fine-tuning: a model of its own, not hooked). Without checkpointing, prompts are shared.
    assert calls_on == (3 if lora else 2) * micro_batches and calls_off > 0
    # (rel 1e-5, not 1e-6: the run without checkpointing shares prompts, the same sums in another order)
    assert (on.loss, on.kl, on.grad_norm) == pytest.approx((off.loss, off.kl, off.grad_norm), rel=1e-5)
    assert off.kl > 0 and torch.allclose(grad_on, grad_off, rtol=1e-5, atol=1e-8)
