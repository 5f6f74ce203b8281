"""Replay losses: stored trajectories of a problem trained again beside its group of fresh rollouts, with one of three
corrections against the policy that generated them (`[replay] correction`, lanpo.feedback.replay_config).

Every row b of a batch is fresh (sampled this step) or replayed (`replayed[b]`, drawn from the store), and carries
the group index of its problem. Per token t of row b, with rho = exp(logp - old) and A the row's advantage:

    fresh rows: exactly `lanpo.rl.loss.policy_loss`'s term (clip, dual clip, TIS weight), old = old_logp
    none:       the same clipped (and dual-clipped) term, old = old_logp: the current policy's own ratio, no TIS
    shaped:     -A * w / (w + shaping), w = exp(clamp(logp - replay_logp, -20, 20)): no clip, no dual clip, no TIS
    separate:   the clipped (and dual-clipped) term with old = replay_logp, no TIS
    every row:  + beta * k3(logp, ref_logp)

`replay_logp` (B, T) are the stored behaviour log-probs of the replayed tokens (`attempt_tokens.logprobs`: the
engine's or the trainer's under the policy that generated them, at the rollout temperature).

What each correction follows (the sources read, not recalled):

- none, RLEP (arXiv 2507.07451; Kwai-Klear/RLEP c15e5b4). Replayed successes are appended to the fresh group in
  the rollout worker (`verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py`):

      response_source = [] # 0 for rollout; 1 for rej; 2 for positive replay;
      ...
      idx = _repeat_interleave(idx, self.sampling_params.n + replay_num)

  so they share the group's uid, and verl's GRPO advantage normalises over the joined group (n + replay rows). The
  trainer then recomputes `old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)` over the whole batch
  (`recipe/dapo/dapo_ray_trainer.py`): the ratio of a replayed token is the current policy's own. The authors say
  so in Kwai-Klear/RLEP issue 7 (asked whether the replayed trajectory's importance ratio is recomputed under the
  current policy): "是的；后续Updating不依赖之前模型的输出概率，仅基于当前模型进行计算" (yes; the update does not
  depend on the earlier model's probabilities, it is computed from the current model alone). verl applies its dual
  clip (`clip_ratio_c`, RLEP's recipes set 10.0) to every token of that batch, replays included; so does lanpo.
- shaped, ExGRPO (arXiv 2510.02245; ElliottYan/LUFFY 01f4ae0, `ExGRPO/`). `exp_scripts/run_exgrpo.sh` runs
  `off_policy_reshape="p_div_p_0.1"`, `loss_remove_clip=True`, `trainer.exp_is_correct=True`; with the latter
  `experience_trainer_ops.py::replace_recorded_old_log_probs` puts the recorded behaviour log-probs in place of
  `old_log_probs` on the replayed rows, and `mix_core_alg.py::compute_token_on_off_policy_loss` takes

      off_ratio = torch.exp(negative_approx_kl)          # log_prob - old_log_prob
      elif off_policy_reshape == "p_div_p_0.1":
          off_ratio = off_ratio / (off_ratio + 0.1)
      off_pg_losses = -advantages * off_ratio

  unclipped. The replayed trajectory is one of the question's n samples (`mix_vllm_rollout_exp.py`, with the run's
  `n=8`, `n_prefix=1`, prefix ratio 1.0: the whole response replayed):

      prefix_ratios.extend([prefix_ratio] * self.config.n_prefix)
      prefix_ratios.extend([0.0] * (self.config.n - self.config.n_prefix))

  so it shares the fresh rows' uid and verl's GRPO advantage (`mix_trainer_helper.py::compute_advantage`, by uid)
  normalises over the mixed group of 7 fresh + 1 replayed (RLEP adds its replays to the n fresh; lanpo joins
  `per_group` replays to the fresh group, as RLEP). Departures: lanpo clamps logp - replay_logp to [-20, 20] before
  the exp, as its own ratio (verl's clamp; a no-op within it); ExGRPO's run also removes the clip from the fresh rows
  (`loss_remove_clip=True` applies to `on_pg_losses` too), divides by the response length, not the token count
  (`loss_remove_token_mean=True`) and does not divide advantages by the std (`algorithm.grpo_use_std=False`): lanpo
  keeps its own fresh term, aggregation and advantages, so that the replay arm differs from GRPO in replay alone.
- separate, RePO (arXiv 2506.09340; SihengLi99/RePO 119fef6, `src/replay_grpo_trainer.py`). With
  `adv_norm_mode=split` (the default of `scripts/train_replay_grpo.slurm`) the advantages are normalised among a
  prompt's online rows and, apart, among its replayed rows ("# ---------- on-policy ----------" /
  "# ---------- off-policy ----------"), and

      ratio        = torch.exp(logp_now - logp_old)
      per_tok_loss = -torch.min(ratio * adv, ratio_clip * adv)  # (B,C)
      on_loss  = _aggregate(per_tok_loss, on_tok_mask)
      off_loss = _aggregate(per_tok_loss, off_tok_mask) if has_off else torch.tensor(0.0, device=device)
      loss = on_loss + self.off_policy_loss_coef * off_loss

  where a replayed row's `logp_old` is the `old_per_token_logps` stored in its cache entry when it was generated
  (the behaviour policy's), and `off_policy_loss_coef` defaults to 1.0. `separate_term_weights` gives the row weights
  that make lanpo's one aggregate equal on_loss + off_loss. Departure: RePO puts the KL on the online tokens only
  ("applies the KL regulariser *only* to on-policy tokens"; its script runs BETA=0.0); lanpo keeps it on every row,
  each part's KL in its own mean. RePO has no dual clip; lanpo's (off unless a recipe sets `dual_clip`) bounds a
  replayed token as a fresh one, where it matters most: A < 0 and a ratio far above 1 against an old behaviour.

A group (or, under separate, a part) of one row gets advantage 0: it has no spread to normalise by (verl would give
it mean 0 and std 1, RePO a NaN std).
"""

from __future__ import annotations

import torch

from lanpo.rl.advantages import EPS, group_advantages
from lanpo.rl.loss import LOG_RATIO_CLAMP, Aggregation, _loss_stats, aggregate, clipped_terms, kl_k3

CORRECTIONS = ("none", "shaped", "separate")  # as lanpo.feedback.replay_config, which lanpo.rl may not import


def replay_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    replayed: torch.Tensor,
    correction: str,
    eps: float = EPS,
) -> torch.Tensor:
    """`(r - mean) / (std + eps)` over each row's set: its group, fresh and replayed joined (none, shaped), or under
    separate the group's rows of its own kind (fresh among fresh, replayed among replayed).

    rewards: (B,); group_index: (B,) integer, rows of one problem share it, in any order and any number;
    replayed: (B,) bool. Returns (B,) float32. The formula of `lanpo.rl.advantages.group_advantages` (unbiased std,
    eps, a set of zero spread gets 0), computed set by set, so that it equals group_advantages bit for bit on its
    layout; a set of one row gets 0.
    """
    _check_correction(correction)
    if rewards.dim() != 1 or group_index.shape != rewards.shape or replayed.shape != rewards.shape:
        raise ValueError(
            f"rewards, group_index and replayed must be 1-D of one length, got {tuple(rewards.shape)}, "
            f"{tuple(group_index.shape)}, {tuple(replayed.shape)}"
        )
    if group_index.dtype.is_floating_point or replayed.dtype != torch.bool:
        raise ValueError(f"group_index must be integer and replayed bool, got {group_index.dtype}, {replayed.dtype}")
    key = group_index.long() * 2 + replayed.long() if correction == "separate" else group_index.long()  # (B,)
    values = rewards.float()
    adv = torch.zeros_like(values)
    for k in torch.unique(key).tolist():
        rows = (key == k).nonzero(as_tuple=True)[0]  # (n,)
        if rows.numel() < 2:
            continue  # no spread to normalise by
        adv[rows] = group_advantages(values[rows], rows.numel(), eps)  # the set as one group of its size
    return adv


def replay_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    replayed: torch.Tensor,
    replay_logp: torch.Tensor | None,
    correction: str,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 5e-4,
    agg: Aggregation = "token-mean",
    shaping: float = 0.1,
    row_weight: torch.Tensor | None = None,
    behavior_logp: torch.Tensor | None = None,
    tis_cap: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`policy_loss` over a batch of fresh and replayed rows, each replayed row's policy term by `correction`.

    logp, old_logp, ref_logp, mask, behavior_logp: (B, T) as in `policy_loss`; advantages: (B,); replayed: (B,) bool;
    replay_logp: (B, T) the stored behaviour log-probs, read on replayed rows only (fresh rows may hold anything
    finite or not; None is allowed under none, which does not use them); row_weight: (B,) multiplies each row's
    per-token loss (policy and KL) before the aggregation (`separate_term_weights`); None: 1. With no replayed row
    and no row_weight the loss and its gradient are `policy_loss`'s bit for bit.

    Returns the scalar loss and `policy_loss`'s detached stats over every row (`ratio_mean` and `clip_frac` of the
    ratio each row's term uses; shaped rows are never clipped), plus `replay_ratio_mean` (the token-mean of that
    ratio over replayed tokens: none, the current over old_logp; shaped and separate, w against replay_logp),
    `replay_shaped_mean` (token-mean w / (w + shaping) over replayed tokens; 0 unless shaped) and
    `replay_token_frac` (replayed tokens over all tokens); each 0 without replayed tokens.
    """
    _check_loss_inputs(
        logp, ref_logp, advantages, mask, replayed, replay_logp, correction, row_weight, beta, dual_clip
    )
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    rep = replayed.unsqueeze(1)  # (B, 1)
    any_replay = bool(replayed.any())
    # The stored behaviour log-probs on replayed rows, old_logp elsewhere: torch.where on the data, before any op,
    # so that whatever replay_logp holds on fresh rows (NaN included) reaches neither their values nor gradients.
    behaviour = old_logp
    if correction != "none" and any_replay:
        behaviour = torch.where(rep, replay_logp, old_logp)  # type: ignore[arg-type]
    old = behaviour if correction == "separate" else old_logp  # the clipped term's old log-probs
    ratio, pg, is_dual = clipped_terms(logp, old, adv, eps_low, eps_high, dual_clip)  # policy_loss's own terms
    weight = torch.ones_like(logp)
    if tis_cap is not None:
        if behavior_logp is None:
            raise ValueError("behavior_logp is required when tis_cap is set")
        weight = torch.exp(old_logp.detach() - behavior_logp).clamp(max=tis_cap).detach()  # (B, T)
        # the engine-trainer mismatch of this step's sampling: fresh rows only
        weight = torch.where(rep, torch.ones_like(weight), weight) if any_replay else weight
        pg = pg * weight
    shaped_frac = None
    if correction == "shaped" and any_replay:
        w = torch.exp(torch.clamp(logp - behaviour, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP))  # (B, T)
        shaped_frac = w / (w + shaping)  # (B, T)
        pg = torch.where(rep, -adv * shaped_frac, pg)  # no clip, no dual clip, no TIS weight
        ratio = torch.where(rep, w, ratio)
        is_dual = None if is_dual is None else is_dual & ~rep
    kl = torch.zeros_like(logp) if ref_logp is None else kl_k3(logp, ref_logp)  # (B, T)
    per_token = pg + beta * kl if beta != 0.0 else pg
    if row_weight is not None:
        per_token = per_token * row_weight.to(logp.dtype).unsqueeze(1)  # (B, T)
    loss = aggregate(per_token, mask, agg)
    with torch.no_grad():
        stats = _loss_stats(ratio, adv, mask, kl, pg, weight, old_logp, behavior_logp, eps_low, eps_high, agg)
        stats.update(_replay_stats(ratio, adv, mask, rep, shaped_frac, is_dual, eps_low, eps_high))
    return loss, stats


def _check_loss_inputs(
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    replayed: torch.Tensor,
    replay_logp: torch.Tensor | None,
    correction: str,
    row_weight: torch.Tensor | None,
    beta: float,
    dual_clip: float | None,
) -> None:
    """`replay_policy_loss`'s shapes, every one exact: a (B, 1) or (T,) tensor would broadcast silently."""
    _check_correction(correction)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (verl's clip_ratio_c), got {dual_clip}")
    if beta != 0.0 and ref_logp is None:
        raise ValueError("ref_logp is required when beta != 0")
    B, T = logp.shape
    if advantages.shape != (B,) or replayed.shape != (B,) or mask.shape != (B, T):
        raise ValueError(
            f"advantages and replayed must be (B,) = ({B},) and mask (B, T) = ({B}, {T}), got "
            f"{tuple(advantages.shape)}, {tuple(replayed.shape)}, {tuple(mask.shape)}"
        )
    if row_weight is not None and row_weight.shape != (B,):
        raise ValueError(f"row_weight must be (B,) = ({B},), got {tuple(row_weight.shape)}")
    if replayed.dtype != torch.bool:
        raise ValueError(f"replayed must be bool, got {replayed.dtype}")
    if correction != "none" and bool(replayed.any()) and (replay_logp is None or replay_logp.shape != (B, T)):
        shape = None if replay_logp is None else tuple(replay_logp.shape)
        raise ValueError(f"correction {correction!r} needs replay_logp (B, T) = ({B}, {T}), got {shape}")


def _replay_stats(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    rep: torch.Tensor,
    shaped_frac: torch.Tensor | None,
    is_dual: torch.Tensor | None,
    eps_low: float,
    eps_high: float,
) -> dict[str, torch.Tensor]:
    """`replay_policy_loss`'s replay stats, token-means over the replayed tokens of `mask` (B, T) (`rep` (B, 1)),
    and `clip_frac` with shaped rows never clipped and `dual_clip_frac`, over every token (where they apply)."""
    rep_mask = mask * rep.to(mask.dtype)  # (B, T)
    rep_tokens = rep_mask.sum()
    denom, all_tokens = rep_tokens.clamp(min=1.0), mask.sum().clamp(min=1.0)
    stats = {
        "replay_ratio_mean": (ratio.detach() * rep_mask).sum() / denom,
        "replay_shaped_mean": (shaped_frac.detach() * rep_mask).sum() / denom
        if shaped_frac is not None
        else torch.zeros((), dtype=mask.dtype),
        "replay_token_frac": rep_tokens / all_tokens,
    }
    if shaped_frac is not None:  # shaped rows have no clip
        is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        stats["clip_frac"] = ((is_clipped & ~rep).to(mask.dtype) * mask).sum() / all_tokens
    if is_dual is not None:
        stats["dual_clip_frac"] = (is_dual.to(mask.dtype) * mask).sum() / all_tokens
    return stats


def separate_term_weights(
    replayed: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregation,
    total_tokens_on: float | None = None,
    total_tokens_off: float | None = None,
) -> torch.Tensor:
    """Row weights (B,) under which agg(row_weight * loss) over the minibatch is agg over its fresh rows plus agg
    over its replayed rows (RePO's on_loss + off_loss): each kind its own mean.

    replayed: (B,) bool; mask: (B, T). "token-mean": a fresh row weighs N / N_on and a replayed row N / N_off, with
    N_on, N_off the fresh and replayed tokens and N = N_on + N_off; "seq-mean": the same with sequences (rows).
    `total_tokens_on`, `total_tokens_off`: N_on and N_off over the whole minibatch, every rank and micro-batch,
    when the caller splits it (`lanpo.train.consumer.update` weights micro-batches so that their losses add up to
    the minibatch's aggregate); they count what `agg` averages over: tokens for token-mean, sequences for seq-mean.
    None (both): counted from this batch. A kind with no rows gets weight 1 on none.
    """
    if replayed.dim() != 1 or replayed.dtype != torch.bool or mask.dim() != 2 or mask.shape[0] != replayed.shape[0]:
        raise ValueError(
            f"replayed must be (B,) bool and mask (B, T), got {tuple(replayed.shape)} {replayed.dtype}, "
            f"{tuple(mask.shape)}"
        )
    if (total_tokens_on is None) != (total_tokens_off is None):
        raise ValueError("give both total_tokens_on and total_tokens_off, or neither")
    if agg == "token-mean":
        per_row = mask.to(torch.float64).sum(dim=1)  # (B,) tokens
    elif agg == "seq-mean":
        per_row = torch.ones(replayed.shape[0], dtype=torch.float64)  # (B,) sequences
    else:
        raise ValueError(f"agg must be 'token-mean' or 'seq-mean', got {agg!r}")
    if total_tokens_on is None:
        n_on, n_off = float(per_row[~replayed].sum()), float(per_row[replayed].sum())
    else:
        n_on, n_off = float(total_tokens_on), float(total_tokens_off)  # type: ignore[arg-type]
    total = n_on + n_off
    w_on = total / n_on if n_on > 0 else 1.0
    w_off = total / n_off if n_off > 0 else 1.0
    return torch.where(replayed, torch.tensor(w_off), torch.tensor(w_on)).to(torch.float32)


def _check_correction(correction: str) -> None:
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
