"""The GRPO policy loss: clipped importance ratio (clip-higher), k3 KL penalty, token- or sequence-mean.

Textbook PPO-clip per token t of rollout i with advantage A_i and ratio rho = exp(logp - old_logp):

    pg = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
    kl = exp(ref_logp - logp) - (ref_logp - logp) - 1          # k3 estimator, >= 0, unbiased for KL(pi||ref)
    loss_t = pg + beta * kl

Aggregation: "token-mean" averages over every unmasked token of the batch (DAPO / paper default: long
responses weigh more); "seq-mean" averages per sequence, then over sequences (original GRPO).

Truncated importance sampling (TIS): when the rollouts came from another engine (vLLM in bf16) than the one that
computes logp (the trainer), the sampler's log-probs `behavior_logp` differ a little from `old_logp`. The policy-
gradient term of each token is then weighted by `min(exp(old_logp - behavior_logp), tis_cap)` (detached), which
corrects for the mismatch with bounded variance; the KL term is not weighted.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean"]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1. Shapes (B, T) -> (B, T)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, agg: Aggregation) -> torch.Tensor:
    """Masked mean of (B, T) values: over all tokens ("token-mean") or per sequence then over sequences."""
    mask = mask.to(values.dtype)
    if agg == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    if agg == "seq-mean":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
        return per_seq.mean()
    raise ValueError(f"agg must be 'token-mean' or 'seq-mean', got {agg!r}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 5e-4,
    agg: Aggregation = "token-mean",
    behavior_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO loss with a k3 KL penalty, optionally with truncated importance sampling.

    logp, old_logp, ref_logp, mask: (B, T) over completion tokens (mask 1 = real token); advantages: (B,).
    ref_logp may be None when beta == 0. behavior_logp (B, T): the sampling engine's log-probs, used when
    `tis_cap` is set. Returns the scalar loss and detached stats: `kl` (token-mean k3), `clip_frac` (share of
    tokens whose clipped branch is active), `ratio_mean`, `pg_loss`, `tis_weight` (token-mean weight; 1
    without TIS) and `logp_diff` (token-mean |old_logp - behavior_logp|; 0 without behavior_logp).
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T)
    weight = torch.ones_like(logp)
    if tis_cap is not None:
        if behavior_logp is None:
            raise ValueError("behavior_logp is required when tis_cap is set")
        weight = torch.exp(old_logp.detach() - behavior_logp).clamp(max=tis_cap).detach()  # (B, T)
        pg = pg * weight
    per_token = pg
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when beta != 0")
        kl = kl_k3(logp, ref_logp)  # (B, T)
        per_token = pg + beta * kl
    else:
        kl = torch.zeros_like(logp) if ref_logp is None else kl_k3(logp, ref_logp)
    loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        denom = mask.sum().clamp(min=1.0)
        stats = {
            "kl": (kl.detach() * mask).sum() / denom,
            "clip_frac": (is_clipped.to(mask.dtype) * mask).sum() / denom,
            "ratio_mean": (ratio.detach() * mask).sum() / denom,
            "pg_loss": aggregate(pg.detach(), mask, agg),
            "tis_weight": (weight * mask).sum() / denom,
            # how far the sampling engine's log-probs sit from the trainer's (0 without them)
            "logp_diff": ((old_logp.detach() - behavior_logp).abs() * mask).sum() / denom
            if behavior_logp is not None
            else torch.zeros((), dtype=logp.dtype),
        }
    return loss, stats


def nll_sum_of(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood summed over the unmasked tokens: -(logp * mask).sum(). Shapes (B, T), (B, T) -> ().

    MEL's J_NLL is this over every target token of a minibatch (all ranks), divided by their count: a token-mean.
    """
    return -(logp * mask.to(logp.dtype)).sum()
