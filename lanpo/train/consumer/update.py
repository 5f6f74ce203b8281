"""The policy update of a GRPO step: reference log-probs, then PPO epochs over minibatches of micro-batches.

Sizes are global. `grpo.minibatch_size` counts sequences over every rank, so a step takes
`ppo_epochs * (batch_size * rollout.n / minibatch_size)` optimizer steps at any world size, and each rank holds
the same share of every minibatch (its next `minibatch_size / world` sequences; see `lanpo.train.plumbing.dist` for why
that makes the minibatches the single process's ones). The loss of a minibatch is the token-mean (or seq-mean)
over all its sequences on all ranks: each rank scales its micro-batch losses by the global token count, and by
the world size because DDP (LoRA) and FSDP (full fine-tuning) average gradients. The policy (`lanpo.train.policy`)
says what trains and what the reference is. Kept apart from the loop so a test can run exactly one update.

The learning-rate schedule advances once per optimizer step, over `steps * optimizer steps a step`. verl steps its
scheduler once per training step, so within a step it holds the rate where lanpo decays it across the minibatches
(8 in the paper recipes); the warmup and the decay span the same share of training either way, and with one
minibatch a step, or a constant schedule (the CPU recipes), the two are the same.

MEL adds an optional term (`nll`): per optimizer step J = J_GRPO + lambda * J_NLL, J_NLL the token-mean negative
log-likelihood of the minibatch's share of the NLL examples over every rank. With LoRA its forwards go through the
unwrapped model, which makes no collective call (ranks may hold different numbers of examples); their gradient
accumulates locally and joins the minibatch's all-reduce at its last GRPO backward. Under FSDP (full fine-tuning on
several ranks) every forward and backward is a collective, so a rank short of examples runs zero-weight ones until
every rank has run as many as the busiest (`nll_backward`). Without the term (or lambda = 0) the update is plain
GRPO, bit for bit.

`temperature` (the loop passes `rollout.temperature`): the policy's, the old and the reference log-probs, and the
entropy, are of softmax(logits / T), the distribution the rollouts were sampled from (verl and TRL do the same;
`lanpo.train.forward.logprobs`). The engine's behaviour log-probs are at T too (`lanpo.rollout.vllm`), so TIS weighs
like with like. MEL's NLL term stays at T = 1: it is the likelihood of target text, not of a sample (the paper's MEL
recipes sample at 1.0, where the two agree).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from lanpo.rl.loss import policy_loss
from lanpo.rl.replay_loss import replay_policy_loss
from lanpo.train.config import GRPOConfig
from lanpo.train.consumer.nll import NLLTerm, nll_backward
from lanpo.train.consumer.replay_rows import ReplayRows, minibatch_blocks, term_weights
from lanpo.train.consumer.skipped import measure_only, skip_update
from lanpo.train.forward.batch import RolloutBatch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs, completion_logprobs, lockstep_rounds, micro_batches
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import Policy

STATS = ("loss", "kl", "entropy", "clip_frac", "dual_clip_frac", "tis_weight", "logp_diff")
REPLAY_STATS = ("replay_ratio_mean", "replay_shaped_mean")  # token-means over replayed tokens (lanpo.rl.replay_loss)


@dataclass
class UpdateStats:
    loss: float
    kl: float
    entropy: float
    grad_norm: float
    clip_frac: float
    tis_weight: float  # token-mean truncated importance weight (1.0 without TIS)
    logp_diff: float | None  # token-mean |trainer log-prob - engine log-prob| (None: the engine reports none)
    zero_spread: float  # share of rollouts whose advantage is exactly 0
    seconds_ref: float
    seconds_update: float
    nll: float | None = None  # J_NLL, token-mean over the optimizer steps that had NLL tokens (None: none had)
    nll_tokens: float | None = None  # NLL target tokens over every rank (None: no NLL term configured)
    dual_clip_frac: float | None = None  # share of tokens held at the dual-clip bound (None: grpo.dual_clip unset)
    replay: dict[str, float] = field(default_factory=dict)  # replay/*: the replayed tokens' weights (none: {})

    def as_metrics(self) -> dict[str, float]:
        out = {
            "loss": self.loss,
            "kl": self.kl,
            "entropy": self.entropy,
            "grad_norm": self.grad_norm,
            "clip_frac": self.clip_frac,
            "groups/zero_spread": self.zero_spread,
        }
        if self.dual_clip_frac is not None:
            out["dual_clip_frac"] = self.dual_clip_frac
        if self.tis_weight != 1.0:
            out["tis/weight"] = self.tis_weight
        if self.logp_diff is not None:
            out["engine/logp_abs_diff"] = self.logp_diff
        if self.nll_tokens is not None:  # a step without examples logs 0 tokens and no J_NLL, never a NaN
            out["mel/nll_tokens"] = self.nll_tokens
        if self.nll is not None:
            out["mel/nll"] = self.nll
        return {**out, **self.replay}


def warmup_schedule(
    optimizer: torch.optim.Optimizer, total_updates: int, warmup_ratio: float, decay: str = "cosine"
) -> Any:
    """Linear warmup over `warmup_ratio` of the updates, then `decay`: "cosine" to 0 (paper: 10% warmup).

    `decay = "constant"` holds the peak after the warmup: a short run (tens of updates) on a cosine spends half its
    updates below half the learning rate.
    """
    warmup = int(total_updates * warmup_ratio)

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        if decay == "constant":
            return 1.0
        progress = (i - warmup) / max(1, total_updates - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def minibatches_per_epoch(global_sequences: int, cfg: GRPOConfig) -> int:
    """Optimizer steps per PPO epoch: the step's sequences over all ranks / `minibatch_size` (0: one minibatch)."""
    return global_sequences // cfg.minibatch_size if cfg.minibatch_size else 1


def micro_batch_loss(
    model: Any,
    sub: RolloutBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor,
    behavior_logp: torch.Tensor | None,
    cfg: GRPOConfig,
    logprob_settings: LogprobSettings | None = None,
    replay: ReplayRows | None = None,
    row_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The clipped GRPO loss of one micro-batch (its own token-mean), its stats, and its entropy (m, T).

    old_logp None: on-policy, the ratio is 1 and the forward's own detached log-probs stand in for it. The
    log-probs are of `logprob_settings` (None: `cfg`'s at temperature 1), of softmax(logits / its temperature), as
    old_logp, ref_logp and behavior_logp must be. `replay`: the micro-batch's replayed rows
    (lanpo.rl.replay_loss.replay_policy_loss, `row_weight` (m,) its terms' weights).
    """
    if logprob_settings is None:
        logprob_settings = LogprobSettings.from_grpo(cfg, temperature=1.0, device=sub.input_ids.device)
    logp, entropy = completion_logprobs(model, sub, True, logprob_settings)  # (m, T)
    old = logp.detach() if old_logp is None else old_logp
    if replay is not None:
        loss, stats = replay_policy_loss(
            logp,
            old,
            ref_logp,
            advantages,
            sub.completion_mask,
            replay.replayed,
            replay.behaviour,
            replay.correction,  # type: ignore[arg-type]
            cfg.eps_low,
            cfg.eps_high,
            cfg.beta,
            cfg.loss_agg,  # type: ignore[arg-type]
            shaping=replay.shaping,
            row_weight=row_weight,
            behavior_logp=behavior_logp,
            tis_cap=cfg.tis_cap,
            dual_clip=cfg.dual_clip,
        )
        return loss, stats, entropy  # type: ignore[return-value]
    loss, stats = policy_loss(
        logp,
        old,
        ref_logp,
        advantages,
        sub.completion_mask,
        cfg.eps_low,
        cfg.eps_high,
        cfg.beta,
        cfg.loss_agg,  # type: ignore[arg-type]
        behavior_logp=behavior_logp,
        tis_cap=cfg.tis_cap,
        dual_clip=cfg.dual_clip,
    )
    return loss, stats, entropy  # type: ignore[return-value]


def update_policy(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    seed: int,
    dist: Dist | None = None,
    behavior_logp: torch.Tensor | None = None,
    nll: NLLTerm | None = None,
    temperature: float = 1.0,
    replay: ReplayRows | None = None,
) -> UpdateStats:
    """PPO epochs x minibatches on this rank's `batch` (B sequences) with `advantages` (B,); returns mean stats.

    The gradient flows through `policy.trained` (DDP or FSDP under torchrun); `policy.reference_logprobs` gives
    the KL term's reference. `behavior_logp` (B, T): the sampling engine's log-probs of the rollout tokens, for
    truncated importance sampling (`cfg.tis_cap`), at `temperature`. `nll`: MEL's NLL term, its examples split
    over the minibatches of each epoch as the rollouts are (pass it on every rank, or on none); its forwards use
    `policy.model`. `temperature`: the rollouts' sampling temperature; every GRPO log-prob is of softmax(logits /
    temperature) (1: the logits as they are, bit for bit what the update computed before the argument existed).
    `replay`: which rows are replayed (`[replay]`); the minibatch count is the fresh rows' (the schedule's), and a
    replayed row trains in its group's minibatch (`lanpo.train.consumer.replay_rows.minibatch_blocks`). Under
    torchrun pass it on every rank, or on none: ranks hold different numbers of replayed rows, so each minibatch's
    sequences are counted over every rank and the ranks run as many micro-batches as the busiest.
    """
    dist = dist or Dist()
    logprob_settings = LogprobSettings.from_grpo(cfg, temperature=temperature, device=batch.input_ids.device)
    zero_spread = float(dist.all_reduce_sum((advantages == 0).float().mean().reshape(1)).item() / dist.world)
    fresh = batch.size - (0 if replay is None else int(replay.replayed.sum()))
    n_minibatches = minibatches_per_epoch(fresh * dist.world, cfg)
    if cfg.skip_zero_spread:
        # Rollouts with advantage 0 carry no policy-gradient signal; dropping them saves their forward/backward
        # (and drops their KL term). Single process only: ranks would hold minibatches of different sizes.
        keep = torch.nonzero(advantages != 0).flatten()
        if keep.numel() == 0:  # nothing to learn from: the schedule advances, the weights do not move
            return _nothing_to_learn(
                policy, optimizer, scheduler, batch, cfg, n_minibatches, zero_spread, logprob_settings
            )
        batch, advantages = batch.select(keep.to(batch.input_ids.device)), advantages[keep]
        behavior_logp = None if behavior_logp is None else behavior_logp[keep]
        replay = None if replay is None else replay.select(keep)

    started = time.perf_counter()
    ref_logp, old_logp = _reference_and_old_logp(policy, batch, cfg, n_minibatches, logprob_settings, dist)
    seconds_ref = time.perf_counter() - started

    started = time.perf_counter()
    nll_on = nll if nll is not None and nll.coef != 0.0 else None  # the same on every rank (a setting, not data)
    update = _Update(policy, batch, advantages, old_logp, ref_logp, behavior_logp, cfg, dist, logprob_settings, nll_on)
    update.replay = replay
    policy.model.train()
    for mb, nll_share in _minibatches(batch.size, n_minibatches, cfg.ppo_epochs, seed, update.nll_size, replay):
        if mb.numel() == 0:  # fewer rollouts kept than minibatches (skip_zero_spread): the schedule still steps
            skip_update(optimizer, scheduler)
            continue
        update.optimizer_step(optimizer, scheduler, mb, nll_share)
    optimizer.zero_grad(set_to_none=True)
    return update.stats(zero_spread, seconds_ref, time.perf_counter() - started)


def _reference_and_old_logp(
    policy: Policy,
    batch: RolloutBatch,
    cfg: GRPOConfig,
    n_minibatches: int,
    logprob_settings: LogprobSettings,
    dist: Dist,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The no-grad passes before the update: the reference's log-probs (B, T), for the KL term, and the old
    policy's (B, T), for the ratio, when several updates reuse the batch (None: on-policy, where the ratio's
    old_logp is the detached log-prob of the forward that carries the gradient)."""
    ref_logp = policy.reference_logprobs(batch, logprob_settings)  # (B, T): KL
    # Several updates per batch: the ratio needs log-probs of the policy that generated it, taken before any step.
    if cfg.ppo_epochs == 1 and n_minibatches == 1:
        return ref_logp, None
    collective = dist if policy.collective_forwards else None
    old_logp = chunked_logprobs(policy.model, batch, logprob_settings, collective)
    return ref_logp, old_logp


def _minibatches(
    size: int, n_minibatches: int, epochs: int, seed: int, nll_size: int, replay: ReplayRows | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each epoch's minibatches of rollout indices (M,), each with its share of the NLL examples (E_i,).

    One epoch: minibatches are consecutive blocks of prompts (already a random draw); several: a fresh order per
    epoch, from a generator seeded the same on every rank (the same local order). `replay`: the fresh rows cut so,
    each block followed by its replayed rows (`minibatch_blocks`)."""
    generator = torch.Generator().manual_seed(seed % (2**63))
    for _epoch in range(epochs):
        order = torch.randperm(size, generator=generator) if epochs > 1 else torch.arange(size)
        nll_shares = torch.tensor_split(torch.arange(nll_size), n_minibatches)
        if replay is None:
            blocks = list(torch.tensor_split(order, n_minibatches))
        else:
            blocks = minibatch_blocks(replay, order, n_minibatches, shuffled=epochs > 1)
        yield from zip(blocks, nll_shares, strict=True)


@dataclass
class _Update:
    """One update's fixed inputs (the batch, its advantages and log-probs), and what it sums over its optimizer
    steps: `optimizer_step` runs one minibatch's micro-steps and steps; `stats` reduces the sums to means."""

    policy: Policy
    batch: RolloutBatch  # (B, P + T)
    advantages: torch.Tensor  # (B,)
    old_logp: torch.Tensor | None  # (B, T); None: on-policy
    ref_logp: torch.Tensor  # (B, T)
    behavior_logp: torch.Tensor | None  # (B, T); None: the engine reports none
    cfg: GRPOConfig
    dist: Dist
    logprob_settings: LogprobSettings  # the update's log-prob forwards (`LogprobSettings.from_grpo`)
    nll: NLLTerm | None  # MEL's term, when it is on (coef != 0)
    replay: ReplayRows | None = None  # the replayed rows (`[replay]`; None: none)
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys((*STATS, "grad_norm"), 0.0))
    updates: int = 0
    nll_updates: int = 0
    nll_total: float = 0.0
    replay_sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("tokens", *REPLAY_STATS), 0.0))

    def __post_init__(self) -> None:
        self.params = self.policy.trainable_parameters()

    @property
    def nll_size(self) -> int:
        return 0 if self.nll is None or self.nll.batch is None else self.nll.batch.size

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, scheduler: Any, mb: torch.Tensor, nll_share: torch.Tensor
    ) -> None:
        """One minibatch `mb` (M,): the NLL backward first, then the GRPO micro-steps (whose last backward syncs),
        the clipped gradient, one optimizer and schedule step; adds the minibatch's stats over every rank."""
        cfg, dist, batch = self.cfg, self.dist, self.batch
        tokens_mb = dist.all_reduce_sum(batch.completion_mask[mb].sum().float()).clamp(min=1).item()
        replay = self.replay
        # the minibatch's sequences over every rank: the same share on each, unless replayed rows make them differ
        seqs_mb = len(mb) * dist.world if replay is None else int(dist.all_reduce_sum(torch.tensor([len(mb)])).item())
        optimizer.zero_grad(set_to_none=True)
        mb_stats = dict.fromkeys(STATS, 0.0)
        if self.nll is not None:
            filler = batch.select(mb[:1].to(batch.input_ids.device)) if self.policy.collective_forwards else None
            mb_nll, nll_tokens = nll_backward(
                self.policy.model,
                self.nll.batch,
                nll_share,
                self.nll.coef,
                self.logprob_settings,
                dist,
                filler,
            )
            if nll_tokens:
                self.nll_updates, self.nll_total = self.nll_updates + 1, self.nll_total + mb_nll
        groups = micro_batches(
            batch.attention_mask[mb].sum(dim=1), cfg.micro_batch_size, cfg.max_tokens_per_micro_batch
        )
        rounds = lockstep_rounds(groups, cfg.max_tokens_per_micro_batch, dist)  # every rank as many as the busiest
        if replay is not None and dist.world > 1:  # the ranks' replayed rows differ in number: so may their rounds
            rounds = int(dist.all_reduce_max(torch.tensor([rounds])).item())
        terms = None if replay is None else term_weights(replay, batch.completion_mask, mb, cfg.loss_agg, dist)
        for r in range(rounds):
            idx = mb[groups[r]] if r < len(groups) else mb[:1]  # (m,); past this rank's own: a filler, weight 0
            self._micro_step(idx, seqs_mb, tokens_mb, r == rounds - 1, mb_stats, r >= len(groups), terms)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        summed = dist.all_reduce_sum(torch.tensor([mb_stats[k] for k in STATS], dtype=torch.float64))
        optimizer.step()
        scheduler.step()
        self.updates += 1
        for key, value in zip(STATS, summed.tolist(), strict=True):
            self.totals[key] += value
        self.totals["grad_norm"] += float(grad_norm)

    def _micro_step(
        self,
        idx: torch.Tensor,
        seqs_mb: int,
        tokens_mb: float,
        last: bool,
        mb_stats: dict[str, float],
        filler: bool = False,
        terms: torch.Tensor | None = None,
    ) -> None:
        """Backward of micro-batch `idx` (m,) of a minibatch of `seqs_mb` sequences and `tokens_mb` tokens over every
        rank; adds its weighted stats to `mb_stats`. `filler`: a rank that has run its own micro-batches runs
        one more with weight 0 and no stats, so its collectives (FSDP; DDP's last-backward all-reduce) line up
        with a busier rank's (`grpo.max_tokens_per_micro_batch` splits ranks' minibatches unevenly). `terms` (B,):
        each row's weight under replay's separate terms (`replay_rows.term_weights`)."""
        cfg, dist = self.cfg, self.dist
        sub = self.batch.select(idx.to(self.batch.input_ids.device))
        # DDP all-reduces on the minibatch's last backward only; the others accumulate locally.
        with contextlib.nullcontext() if last else self.policy.no_sync():
            loss, stats, entropy = micro_batch_loss(
                self.policy.trained,
                sub,
                self.advantages[idx],
                None if self.old_logp is None else self.old_logp[idx],
                self.ref_logp[idx],
                None if self.behavior_logp is None else self.behavior_logp[idx],
                cfg,
                self.logprob_settings,
                None if self.replay is None else self.replay.select(idx),
                None if terms is None else terms[idx],
            )
            # Weight micro-batches so the minibatch loss is the exact token-mean (or seq-mean) over every
            # rank's sequences; times the world size, since DDP and FSDP average the ranks' gradients.
            tokens = sub.completion_mask.sum().item()
            weight = tokens / tokens_mb if cfg.loss_agg == "token-mean" else len(idx) / seqs_mb
            if filler:
                weight = 0.0  # its gradient is exactly 0
            (loss * weight * dist.world).backward()
        if filler:
            return
        token_weight = tokens / tokens_mb
        mb_stats["loss"] += loss.item() * weight
        for key in ("kl", "clip_frac", "dual_clip_frac", "tis_weight", "logp_diff"):
            mb_stats[key] += stats[key].item() * token_weight
        mb_stats["entropy"] += float((entropy * sub.completion_mask.float()).sum() / tokens_mb)  # type: ignore[operator]
        if self.replay is not None:  # token-means over the replayed tokens: summed here, divided in `stats`
            replayed = float(sub.completion_mask[self.replay.replayed[idx]].sum())
            self.replay_sums["tokens"] += replayed
            for key in REPLAY_STATS:
                self.replay_sums[key] += stats[key].item() * replayed

    def stats(self, zero_spread: float, seconds_ref: float, seconds_update: float) -> UpdateStats:
        """The mean of every stat over the optimizer steps taken (and J_NLL over those that had NLL tokens)."""
        mean = {k: v / max(self.updates, 1) for k, v in self.totals.items()}
        nll_stats = {}
        if self.nll is not None:
            local = 0.0 if self.nll.batch is None else float(self.nll.batch.completion_mask.sum())
            tokens = self.dist.all_reduce_sum(torch.tensor([local], dtype=torch.float64)).item()
            nll_stats = {"nll": self.nll_total / self.nll_updates if self.nll_updates else None, "nll_tokens": tokens}
        return UpdateStats(
            loss=mean["loss"],
            kl=mean["kl"],
            entropy=mean["entropy"],
            grad_norm=mean["grad_norm"],
            clip_frac=mean["clip_frac"],
            tis_weight=mean["tis_weight"],
            logp_diff=None if self.behavior_logp is None else mean["logp_diff"],
            zero_spread=zero_spread,
            seconds_ref=seconds_ref,
            seconds_update=seconds_update,
            dual_clip_frac=None if self.cfg.dual_clip is None else mean["dual_clip_frac"],
            replay=self._replay_means(),
            **nll_stats,
        )

    def _replay_means(self) -> dict[str, float]:
        """replay/ratio_mean, and under the shaped correction replay/shaped_mean, over every replayed token the
        update trained on ({}: none). A correction without shaping writes no shaped_mean (a 0 would read as a
        measured weight)."""
        tokens = self.replay_sums["tokens"]
        if not tokens or self.replay is None:
            return {}
        keys = [k for k in REPLAY_STATS if k != "replay_shaped_mean" or self.replay.correction == "shaped"]
        return {f"replay/{key.removeprefix('replay_')}": self.replay_sums[key] / tokens for key in keys}


def _nothing_to_learn(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: RolloutBatch,
    cfg: GRPOConfig,
    n_minibatches: int,
    zero_spread: float,
    logprob_settings: LogprobSettings,
) -> UpdateStats:
    """Every group skipped: the batch's KL and entropy measured, and the schedule stepped as often as an update
    would have (each step moving nothing)."""
    measured = measure_only(policy, batch, logprob_settings)
    for _ in range(cfg.ppo_epochs * n_minibatches):
        skip_update(optimizer, scheduler)
    return UpdateStats(
        0.0,
        measured["kl"],
        measured["entropy"],
        0.0,
        0.0,
        1.0,
        None,
        zero_spread,
        measured["ref"],
        measured["policy"],  # seconds_ref, seconds_update: the measuring passes
        dual_clip_frac=None if cfg.dual_clip is None else 0.0,
    )
