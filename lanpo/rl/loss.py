"""The GRPO policy loss: clipped importance ratio (clip-higher, optional dual clip), k3 KL penalty, token- or
sequence-mean.

Textbook PPO-clip per token t of rollout i with advantage A_i and ratio rho = exp(logp - old_logp):

    pg = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
    pg = min(pg, -A * c)   if A < 0 and dual_clip = c is set       # dual-clip PPO (Ye et al. 2019, arXiv 1912.09729)
    kl = exp(ref_logp - logp) - (ref_logp - logp) - 1          # k3 estimator, >= 0, unbiased for KL(pi||ref)
    loss_t = pg + beta * kl

Aggregation: "token-mean" averages over every unmasked token of the batch (DAPO / paper default: long
responses weigh more); "seq-mean" averages per sequence, then over sequences (original GRPO).

Truncated importance sampling (TIS): when the rollouts came from another engine (vLLM in bf16) than the one that
computes logp (the trainer), the sampler's log-probs `behavior_logp` differ a little from `old_logp`. The policy-
gradient term of each token is then weighted by `min(exp(old_logp - behavior_logp), tis_cap)` (detached), which
corrects for the mismatch with bounded variance; the KL term is not weighted. All three log-probs must be of the
same distribution: the trainer's are at the rollout temperature
(`lanpo.train.forward.logprobs.completion_logprobs`), and so are vLLM's (`lanpo.rollout.vllm`).

Against verl (the paper trains with it; `verl/trainer/ppo/core_algos.py` at volcengine/verl b178a3c, read, not
recalled):
- The policy term is verl's `compute_policy_loss_vanilla` (and the deprecated `compute_policy_loss`): the same
  clip, the same dual clip on negative-advantage tokens (`clip_ratio_c`, verl's default 3.0; here `dual_clip`,
  off unless a recipe sets it), the same clamp of `logp - old_logp` to [-20, 20] before the exp ("Clamp
  negative_approx_kl for stability": a no-op while |logp - old_logp| <= 20; beyond, it zeroes the gradient of a
  token whose ratio, up to e^20 = 5e8, would swamp the step), and the TIS weight (verl's `rollout_is_weights`)
  multiplies the clipped term, as here.
  `dual_clip_frac` is verl's `pg_clipfrac_lower` and `clip_frac` its `pg_clipfrac` (`pg_losses2 > pg_losses1`:
  the same tokens), both before the TIS weight.
- KL: verl's `kl_penalty_forward` for "low_var_kl" / "k3" (verl's default `kl_loss_type`) is this k3 with
  `ref - logp` clamped to [-20, 20] and the estimate clamped to [-10, 10]; `kl_k3` applies both clamps. Inside
  them (ref - logp between about -11 and 2.6: any token of a run whose KL is near the paper's scale) it is bit for
  bit the unclamped k3; beyond them the clamp zeroes the token's KL gradient, in verl and here.
- Aggregation: "token-mean" is the masked sum over the mini-batch divided by its token count over every rank,
  the policy and the KL term alike (`lanpo.train.consumer.update` weights its micro-batches so): verl's `agg_loss` when
  it is given the global counts (`global_batch_info`, which `verl/workers/utils/losses.py::ppo_loss` fills).
  Departure: verl's legacy FSDP actor (`dp_actor.py::update_policy`) leaves them empty, so each micro-batch's
  loss is its own token-mean scaled by `1 / gradient_accumulation`, whatever its token count; the two agree when
  micro-batches hold equal token counts. lanpo keeps the exact mean, so that `micro_batch_size`, a memory
  setting, changes no gradient (tests/train/test_update.py). "seq-mean" is verl's "seq-mean-token-mean", except
  that verl leaves a sequence without tokens out of the count of sequences and lanpo counts it with a mean of 0:
  an empty completion (a masked pad, `build_batch`) is the only such sequence, and an engine returns one only when
  it generated nothing.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean"]

# verl's clamps (core_algos.py): `logp - old_logp` before its exp in the ratio, `ref - logp` before its exp in k3,
# and the k3 estimate itself.
LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1. Shapes (B, T) -> (B, T).

    As verl's "low_var_kl": `ref - logp` clamped to [-20, 20] and the estimate to [-10, 10] (see the module docstring).
    """
    delta = torch.clamp(ref_logp - logp, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(delta) - delta - 1.0, min=-KL_CLAMP, max=KL_CLAMP)


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
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO loss with a k3 KL penalty, optionally dual-clipped and with truncated importance sampling.

    logp, old_logp, ref_logp, mask: (B, T) over completion tokens (mask 1 = real token); advantages: (B,).
    ref_logp may be None when beta == 0. behavior_logp (B, T): the sampling engine's log-probs, used when
    `tis_cap` is set. `dual_clip` = c > 1 bounds the loss of a negative-advantage token by -A * c, as verl's
    `compute_policy_loss_vanilla` does with `clip_ratio_c`:

        pg_losses3 = -advantages * clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    so a token whose ratio ran far above 1 + eps_high while A < 0 (the clip does not bound that side) contributes
    -A * c and no gradient. None: no dual clip.

    Returns the scalar loss and detached stats: `kl` (token-mean k3), `clip_frac` (share of tokens whose clipped
    branch is active), `dual_clip_frac` (share of tokens whose dual-clip bound is active: verl's
    `pg_clipfrac_lower`; 0 without it), `ratio_mean`, `pg_loss`, `tis_weight` (token-mean weight; 1 without TIS)
    and `logp_diff` (token-mean |old_logp - behavior_logp|; 0 without behavior_logp).
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (verl's clip_ratio_c), got {dual_clip}")
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    ratio, pg, is_dual = clipped_terms(logp, old_logp, adv, eps_low, eps_high, dual_clip)
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
        stats = _loss_stats(ratio, adv, mask, kl, pg, weight, old_logp, behavior_logp, eps_low, eps_high, agg)
        if is_dual is not None:
            stats["dual_clip_frac"] = (is_dual.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, stats


def clipped_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The clipped (and dual-clipped) policy term per token, as verl computes it: `ratio` (B, T), `pg` (B, T) and
    `is_dual` (B, T) bool, the tokens whose dual-clip bound is active (verl's `torch.gt(clip_pg_losses1,
    pg_losses3) * (advantages < 0)`; None without a dual clip). adv: (B, 1). `policy_loss` and
    `lanpo.rl.replay_loss.replay_policy_loss` both take their terms from here, so fresh rows agree bit for bit."""
    log_ratio = torch.clamp(logp - old_logp, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)  # as verl, for stability
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)  # (B, T)
    if dual_clip is None:
        return ratio, pg, None
    dual_bound = -adv * dual_clip  # (B, 1)
    is_dual = (pg.detach() > dual_bound) & (adv < 0)
    return ratio, torch.where(adv < 0, torch.minimum(pg, dual_bound), pg), is_dual


def _loss_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor,
    pg: torch.Tensor,
    weight: torch.Tensor,
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor | None,
    eps_low: float,
    eps_high: float,
    agg: Aggregation,
) -> dict[str, torch.Tensor]:
    """`policy_loss`'s detached stats, token-means over `mask` (B, T); `dual_clip_frac` 0 (the caller sets it
    when the dual clip is on)."""
    is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    denom = mask.sum().clamp(min=1.0)
    return {
        "kl": (kl.detach() * mask).sum() / denom,
        "clip_frac": (is_clipped.to(mask.dtype) * mask).sum() / denom,
        "dual_clip_frac": torch.zeros((), dtype=mask.dtype),
        "ratio_mean": (ratio.detach() * mask).sum() / denom,
        "pg_loss": aggregate(pg.detach(), mask, agg),
        "tis_weight": (weight * mask).sum() / denom,
        # how far the sampling engine's log-probs sit from the trainer's (0 without them)
        "logp_diff": ((old_logp.detach() - behavior_logp).abs() * mask).sum() / denom
        if behavior_logp is not None
        else torch.zeros((), dtype=mask.dtype),
    }


def nll_sum_of(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood summed over the unmasked tokens: -(logp * mask).sum(). Shapes (B, T), (B, T) -> ().

    MEL's J_NLL is this over every target token of a minibatch (all ranks), divided by their count: a token-mean.
    """
    return -(logp * mask.to(logp.dtype)).sum()
