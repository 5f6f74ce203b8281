"""The policy update of a GRPO step: reference log-probs, then PPO epochs over minibatches of micro-batches.

Kept apart from the loop so a test can run exactly one update on a tiny model with chosen advantages.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from lanpo.rl.loss import policy_loss
from lanpo.train.batch import RolloutBatch, completion_logprobs, policy_logprobs, reference_logprobs
from lanpo.train.config import GRPOConfig
from lanpo.train.dist import Dist


@dataclass
class UpdateStats:
    loss: float
    kl: float
    entropy: float
    grad_norm: float
    clip_frac: float
    zero_spread: float  # share of rollouts whose advantage is exactly 0
    updates: int
    seconds_ref: float
    seconds_update: float

    def as_metrics(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "kl": self.kl,
            "entropy": self.entropy,
            "grad_norm": self.grad_norm,
            "clip_frac": self.clip_frac,
            "groups/zero_spread": self.zero_spread,
        }


def cosine_schedule(optimizer: torch.optim.Optimizer, total_updates: int, warmup_ratio: float) -> Any:
    """Linear warmup over `warmup_ratio` of the updates, then cosine decay to 0 (paper: 10% warmup)."""
    warmup = int(total_updates * warmup_ratio)

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        progress = (i - warmup) / max(1, total_updates - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _no_update(optimizer: torch.optim.Optimizer, scheduler: Any, cfg: GRPOConfig, zero_spread: float) -> UpdateStats:
    updates = 0
    for _ in range(cfg.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()  # no gradients: a no-op that keeps optimizer / scheduler step counts in line
        scheduler.step()
        updates += 1
    nan = math.nan
    return UpdateStats(nan, nan, nan, 0.0, 0.0, zero_spread, updates, 0.0, 0.0)


def update_policy(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    seed: int,
    dist: Dist | None = None,
) -> UpdateStats:
    """PPO epochs x minibatches on `batch` (B sequences) with `advantages` (B,); returns averaged stats.

    Under data parallelism (`dist`), every rank holds its own B sequences; token counts and gradients are summed
    over ranks so the update equals the single-process one over all ranks' rollouts.
    """
    dist = dist or Dist()
    params = [p for p in model.parameters() if p.requires_grad]
    zero_spread = float(dist.all_reduce_sum((advantages == 0).float().mean().reshape(1)).item() / dist.world)
    n_minibatches = batch.size // cfg.minibatch_size if cfg.minibatch_size else 1
    if cfg.skip_zero_spread:
        # Rollouts with advantage 0 carry no policy-gradient signal; dropping them saves their forward/backward
        # (and drops their KL term). Nothing left: the schedule still advances, the weights do not move.
        keep = torch.nonzero(advantages != 0).flatten()
        if keep.numel() == 0:
            return _no_update(optimizer, scheduler, cfg, zero_spread)
        batch, advantages = batch.select(keep.to(batch.input_ids.device)), advantages[keep]
    B = batch.size
    minibatch = -(-B // n_minibatches)  # the configured number of minibatches, over the rollouts kept
    on_policy = cfg.ppo_epochs == 1 and minibatch == B

    started = time.perf_counter()
    ref_logp = reference_logprobs(model, batch, cfg.micro_batch_size) if cfg.beta > 0 else None  # (B, T)
    # Several updates per batch: the ratio needs log-probs of the policy that generated it, taken before any step.
    old_logp = None if on_policy else policy_logprobs(model, batch, cfg.micro_batch_size)  # (B, T)
    seconds_ref = time.perf_counter() - started

    started = time.perf_counter()
    totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
    updates = 0
    generator = torch.Generator().manual_seed(seed % (2**63))
    model.train()
    for _epoch in range(cfg.ppo_epochs):
        order = torch.randperm(B, generator=generator) if not on_policy else torch.arange(B)
        for start in range(0, B, minibatch):
            mb = order[start : start + minibatch]  # (M,)
            tokens_mb = dist.all_reduce_sum(batch.completion_mask[mb].sum().float()).clamp(min=1).item()
            optimizer.zero_grad(set_to_none=True)
            mb_stats = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
            for micro_start in range(0, len(mb), cfg.micro_batch_size):
                idx = mb[micro_start : micro_start + cfg.micro_batch_size]  # (m,)
                sub = batch.select(idx.to(batch.input_ids.device))
                logp, entropy = completion_logprobs(model, sub, with_entropy=True)  # (m, T) each
                old = logp.detach() if old_logp is None else old_logp[idx]
                ref = None if ref_logp is None else ref_logp[idx]
                loss, stats = policy_loss(
                    logp,
                    old,
                    ref,
                    advantages[idx],
                    sub.completion_mask,
                    cfg.eps_low,
                    cfg.eps_high,
                    cfg.beta,
                    cfg.loss_agg,  # type: ignore[arg-type]
                )
                # Weight micro-batches so the minibatch loss is the exact token-mean (or seq-mean) over it.
                tokens = sub.completion_mask.sum().item()
                weight = tokens / tokens_mb if cfg.loss_agg == "token-mean" else len(idx) / (len(mb) * dist.world)
                (loss * weight).backward()
                token_weight = tokens / tokens_mb
                mb_stats["loss"] += loss.item() * weight
                mb_stats["kl"] += stats["kl"].item() * token_weight
                mb_stats["clip_frac"] += stats["clip_frac"].item() * token_weight
                mask = sub.completion_mask.float()
                mb_stats["entropy"] += float((entropy * mask).sum() / tokens_mb)
            dist.sum_gradients(params)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            summed = dist.all_reduce_sum(torch.tensor([mb_stats[k] for k in ("loss", "kl", "entropy", "clip_frac")]))
            mb_stats = dict(zip(("loss", "kl", "entropy", "clip_frac"), summed.tolist(), strict=True))
            optimizer.step()
            scheduler.step()
            updates += 1
            for key, value in mb_stats.items():
                totals[key] += value
            totals["grad_norm"] += float(grad_norm)
    optimizer.zero_grad(set_to_none=True)
    seconds_update = time.perf_counter() - started
    return UpdateStats(
        loss=totals["loss"] / updates,
        kl=totals["kl"] / updates,
        entropy=totals["entropy"] / updates,
        grad_norm=totals["grad_norm"] / updates,
        clip_frac=totals["clip_frac"] / updates,
        zero_spread=zero_spread,
        updates=updates,
        seconds_ref=seconds_ref,
        seconds_update=seconds_update,
    )
