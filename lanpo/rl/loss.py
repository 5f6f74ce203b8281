"""The GRPO policy loss: clipped importance ratio (clip-higher), k3 KL penalty, token- or sequence-mean.

Textbook PPO-clip per token t of rollout i with advantage A_i and ratio rho = exp(logp - old_logp):

    pg = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
    kl = exp(ref_logp - logp) - (ref_logp - logp) - 1          # k3 estimator, >= 0, unbiased for KL(pi||ref)
    loss_t = pg + beta * kl

Aggregation: "token-mean" averages over every unmasked token of the batch (DAPO / paper default: long
responses weigh more); "seq-mean" averages per sequence, then over sequences (original GRPO).
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO loss with a k3 KL penalty.

    logp, old_logp, ref_logp, mask: (B, T) over completion tokens (mask 1 = real token); advantages: (B,).
    ref_logp may be None when beta == 0. Returns the scalar loss and detached stats: `kl` (token-mean k3),
    `clip_frac` (share of tokens whose clipped branch is active), `ratio_mean`, `pg_loss`.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T)
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
        }
    return loss, stats


def policy_loss_reference(
    logp: list[list[float]],
    old_logp: list[list[float]],
    ref_logp: list[list[float]],
    advantages: list[float],
    mask: list[list[int]],
    eps_low: float,
    eps_high: float,
    beta: float,
    agg: Aggregation = "token-mean",
) -> float:
    """Plain-loop reference of `policy_loss`'s value (tests compare with allclose)."""
    import math

    total, count, seq_means = 0.0, 0, []
    for b, adv in enumerate(advantages):
        seq_total, seq_count = 0.0, 0
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old_logp[b][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            pg = max(-adv * ratio, -adv * clipped)
            delta = ref_logp[b][t] - logp[b][t]
            value = pg + beta * (math.exp(delta) - delta - 1)
            total, count = total + value, count + 1
            seq_total, seq_count = seq_total + value, seq_count + 1
        seq_means.append(seq_total / max(seq_count, 1))
    return total / max(count, 1) if agg == "token-mean" else sum(seq_means) / len(seq_means)
