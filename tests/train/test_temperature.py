"""Temperature-scaled log-probs: at rollout.temperature T the trainer's log-probs (the policy's, the old, the
reference's) and entropy are those of softmax(logits / T), the distribution the rollouts were sampled from, as
verl and TRL compute them. Each is checked against a loop written out one unpadded sequence and one token at a
time; at T = 1 nothing changes, bit for bit. That the vLLM engine reports its log-probs at the same temperature,
so that TIS compares like with like, is checked on the real engine by the vllm lane
(tests/vllm_engine/test_generate.py::test_engine_logprobs_match_the_trainers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig
from lanpo.train.consumer.update import update_policy, warmup_schedule
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.policy import LoraPolicy, load_policy

T = 0.7
PAD = 0
CPU = torch.device("cpu")


def _rollouts(seed: int = 4) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """3 prompts x 4 completions, as the loop lays them out (a group's rows together): uneven prompt and
    completion lengths, and group-centred advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for length in (4, 11, 7):
        prompt = torch.randint(5, 90, (length,), generator=g).tolist()
        for _ in range(4):
            prompts.append(prompt)
            completions.append(
                torch.randint(5, 90, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
            )
    advantages = torch.randn(3, 4, generator=g)
    return prompts, completions, (advantages - advantages.mean(dim=1, keepdim=True)).flatten()


def _lora_model() -> Any:
    """The tiny random model with a LoRA adapter off zero (the policy differs from its reference, the adapter
    disabled), its logits scaled up so that a temperature moves the log-probs well past float rounding."""
    model, _ = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
        model.get_base_model().model.norm.weight.mul_(4.0)  # a random model's logits are near-uniform
    # (measured: |log p at 0.7 - at 1| 0.28 a token on average; k3 to the reference at most 0.35, inside verl's clamp)
    return model


def _loop_logprobs(model: Any, prompts: list, completions: list, temperature: float) -> list[list[torch.Tensor]]:
    """log_softmax(logits / temperature) gathered token by token, each sequence run alone and unpadded; keeps the
    graph (a list per sequence of 0-d tensors)."""
    rows = []
    for prompt, completion in zip(prompts, completions, strict=True):
        logits = model(input_ids=torch.tensor([prompt + completion]), use_cache=False).logits[0]  # (L, V)
        row = []
        for t, token in enumerate(completion):
            position = len(prompt) + t - 1  # predicts completion token t
            row.append(torch.log_softmax(logits[position].float() / temperature, dim=-1)[token])
        rows.append(row)
    return rows


def _loop_entropy(model: Any, prompts: list, completions: list, temperature: float) -> list[list[float]]:
    rows = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions, strict=True):
            logits = model(input_ids=torch.tensor([prompt + completion]), use_cache=False).logits[0]
            row = []
            for t in range(len(completion)):
                logp = torch.log_softmax(logits[len(prompt) + t - 1].float() / temperature, dim=-1)
                row.append(float(-(logp.exp() * logp).sum()))
            rows.append(row)
    return rows


def _padded(rows: list[list[Any]], batch: RolloutBatch) -> torch.Tensor:
    """Per-sequence lists of numbers -> (B, T) laid out as the batch's completions (0 at padding)."""
    out = torch.zeros(batch.completion_ids.shape)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor([float(v) for v in row])
    return out


@pytest.mark.parametrize("share_prompts", [False, True], ids=["rows-whole", "shared-prompts"])
def test_log_probs_and_entropy_at_a_temperature_match_a_loop(share_prompts: bool) -> None:
    prompts, completions, _ = _rollouts()
    batch = build_batch(prompts, completions, PAD, torch.device("cpu"))
    model = _lora_model()
    with torch.no_grad():
        logp, entropy = completion_logprobs(
            model, batch, True, LogprobSettings(share_prompts=share_prompts, temperature=T)
        )
        plain, _ = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=share_prompts))
        want = _padded(_loop_logprobs(model, prompts, completions, T), batch)
    want_entropy = _padded(_loop_entropy(model, prompts, completions, T), batch)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logp[mask], want[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], want_entropy[mask], atol=1e-5)  # type: ignore[index]
    # the temperature moves them far past that tolerance (else this test could not tell)
    assert (logp[mask] - plain[mask]).abs().mean() > 0.1


@pytest.mark.parametrize("share_prompts", [False, True], ids=["rows-whole", "shared-prompts"])
def test_at_temperature_one_the_log_probs_are_what_they_were_bit_for_bit(share_prompts: bool) -> None:
    prompts, completions, _ = _rollouts()
    batch = build_batch(prompts, completions, PAD, torch.device("cpu"))
    model = _lora_model()
    with torch.no_grad():
        before, before_entropy = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=share_prompts))
        now, now_entropy = completion_logprobs(
            model, batch, True, LogprobSettings(share_prompts=share_prompts, autocast=None, temperature=1.0)
        )
    assert torch.equal(now, before) and torch.equal(now_entropy, before_entropy)  # type: ignore[arg-type]


def test_a_temperature_must_be_positive() -> None:
    prompts, completions, _ = _rollouts()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        completion_logprobs(
            _lora_model(),
            build_batch(prompts, completions, PAD, torch.device("cpu")),
            logprob_settings=LogprobSettings(temperature=0.0),
        )


class CaptureGrad(torch.optim.SGD):
    """An optimizer that records each minibatch's accumulated gradient instead of stepping (the weights stay)."""

    captured: list[torch.Tensor]

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.captured = [*getattr(self, "captured", []), torch.cat([p.grad.flatten() for p in self.trained()])]

    def trained(self) -> list[torch.nn.Parameter]:
        return list(self.param_groups[0]["params"])


def _hand_written_loss(model: Any, prompts: list, completions: list, advantages: torch.Tensor, cfg: GRPOConfig):
    """The token-mean GRPO loss of these sequences at temperature T, token by token: the policy's log-prob and the
    reference's (the adapter disabled) both of softmax(logits / T); the weights have not moved since the rollouts,
    so the ratio is exp(logp - logp.detach()) = 1."""
    logps = _loop_logprobs(model, prompts, completions, T)
    with torch.no_grad(), model.disable_adapter():
        refs = _loop_logprobs(model, prompts, completions, T)
    terms = []
    for row, ref_row, advantage in zip(logps, refs, advantages.tolist(), strict=True):
        for logp, ref in zip(row, ref_row, strict=True):
            ratio = torch.exp(logp - logp.detach())
            clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
            pg = torch.maximum(-advantage * ratio, -advantage * clipped)
            terms.append(pg + cfg.beta * (torch.exp(ref - logp) - (ref - logp) - 1))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("share_prompts", [False, True], ids=["rows-whole", "shared-prompts"])
def test_an_update_at_a_temperature_equals_a_hand_written_loop(share_prompts: bool) -> None:
    """Two minibatches of one epoch: the update takes old_logp in a pass of its own (`chunked_logprobs`) and the
    reference's log-probs in another. Were either at T = 1 while the policy's are at T, the ratio or the KL term
    would move off the loop's, and with them the loss and the gradient."""
    prompts, completions, advantages = _rollouts()
    batch = build_batch(prompts, completions, PAD, torch.device("cpu"))
    cfg = GRPOConfig(
        learning_rate=1e-3, warmup_ratio=0.0, beta=0.1, micro_batch_size=3, minibatch_size=6, max_grad_norm=1e9,
        share_prompts=share_prompts,
    )  # fmt: skip
    model = _lora_model()
    optimizer = CaptureGrad([p for p in model.parameters() if p.requires_grad], lr=0.0)
    stats = update_policy(
        LoraPolicy(model), optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, 0, temperature=T
    )

    hand = _lora_model()
    params = [p for p in hand.parameters() if p.requires_grad]
    losses, grads = [], []
    for rows in (slice(0, 6), slice(6, 12)):
        hand.zero_grad(set_to_none=True)
        loss = _hand_written_loss(hand, prompts[rows], completions[rows], advantages[rows], cfg)
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in params]))
    assert len(optimizer.captured) == 2
    assert stats.loss == pytest.approx(sum(losses) / 2, rel=1e-5, abs=1e-7)
    for got, want in zip(optimizer.captured, grads, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    assert stats.clip_frac == 0.0 and stats.kl > 0  # ratio 1 everywhere: old_logp is at T as well

    # Entropy as the loop's at T (token-mean of each minibatch, averaged).
    entropy = _padded(_loop_entropy(hand, prompts, completions, T), batch)
    mask = batch.completion_mask.float()
    per_mb = [float((entropy[r] * mask[r]).sum() / mask[r].sum()) for r in (slice(0, 6), slice(6, 12))]
    assert stats.entropy == pytest.approx(sum(per_mb) / 2, rel=1e-5)


def test_tis_compares_the_engine_and_the_trainer_at_one_temperature() -> None:
    """An engine that samples at T and reports log p at T (vLLM in processed_logprobs mode) agrees with the trainer:
    weight 1, no difference. The raw log-probs at T = 1 (vLLM's default mode) would not."""
    prompts, completions, advantages = _rollouts()
    batch = build_batch(prompts, completions, PAD, torch.device("cpu"))
    cfg = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, beta=0.1, micro_batch_size=4, tis_cap=2.0)
    model = _lora_model()
    with torch.no_grad():
        at_t = _padded(_loop_logprobs(model, prompts, completions, T), batch)
        at_one = _padded(_loop_logprobs(model, prompts, completions, 1.0), batch)
    runs = {}
    for name, engine in (("at T", at_t), ("at 1", at_one)):
        model = _lora_model()
        optimizer = CaptureGrad([p for p in model.parameters() if p.requires_grad], lr=0.0)
        runs[name] = update_policy(
            LoraPolicy(model), optimizer, warmup_schedule(optimizer, 4, 0.0), batch, advantages, cfg, 0,
            behavior_logp=engine, temperature=T,
        )  # fmt: skip
    assert runs["at T"].logp_diff < 1e-5 and runs["at T"].tis_weight == pytest.approx(1.0, abs=1e-5)
    assert runs["at 1"].logp_diff > 0.1  # a weight of another distribution: what lanpo no longer compares


def test_a_batch_without_signal_measures_kl_and_entropy_at_the_temperature() -> None:
    """Every group skipped (skip_zero_spread, advantages 0): KL and entropy are still measured, at T."""
    prompts, completions, _ = _rollouts()
    batch = build_batch(prompts, completions, PAD, torch.device("cpu"))
    cfg = GRPOConfig(learning_rate=1e-3, warmup_ratio=0.0, micro_batch_size=5, skip_zero_spread=True)
    model = _lora_model()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    stats = update_policy(
        LoraPolicy(model), optimizer, warmup_schedule(optimizer, 4, 0.0), batch, torch.zeros(12), cfg, 0, temperature=T
    )
    with torch.no_grad():
        logp = _padded(_loop_logprobs(model, prompts, completions, T), batch)
        with model.disable_adapter():
            ref = _padded(_loop_logprobs(model, prompts, completions, T), batch)
    entropy = _padded(_loop_entropy(model, prompts, completions, T), batch)
    mask = batch.completion_mask.float()
    kl = ((torch.exp(ref - logp) - (ref - logp) - 1) * mask).sum() / mask.sum()
    assert stats.kl == pytest.approx(float(kl), rel=1e-4) and stats.kl > 0
    assert stats.entropy == pytest.approx(float((entropy * mask).sum() / mask.sum()), rel=1e-5)
