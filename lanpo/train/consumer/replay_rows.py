"""The replayed rows of an update's batch (`[replay]`): which rows, their stored behaviour log-probs, the correction.

`lanpo.train.consumer.update` hands a micro-batch with replayed rows to `lanpo.rl.replay.replay_policy_loss`
instead of `policy_loss`; without replayed rows it never comes here, so an update without replay is the update it
always was, bit for bit. Under `correction = "separate"` (RePO) each minibatch's fresh and replayed rows are two
terms, each its own token-mean (or seq-mean) over every rank: `term_weights` gives each row the weight that makes
the minibatch's one aggregate equal their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanpo.rl.replay import separate_term_weights
from lanpo.train.plumbing.dist import Dist


@dataclass(frozen=True)
class ReplayRows:
    """Which rows of a batch (B,) are replayed, their stored behaviour log-probs (B, T; 0 on fresh rows), and the
    correction with its shaping constant (`ReplayConfig`)."""

    replayed: torch.Tensor  # (B,) bool
    behaviour: torch.Tensor  # (B, T)
    correction: str
    shaping: float

    def select(self, index: torch.Tensor) -> ReplayRows:
        return ReplayRows(self.replayed[index], self.behaviour[index], self.correction, self.shaping)


def term_weights(rows: ReplayRows, mask: torch.Tensor, mb: torch.Tensor, agg: str, dist: Dist) -> torch.Tensor | None:
    """(B,) weights over the whole batch for minibatch `mb` (M,) under `separate`, so that the minibatch's one
    aggregate equals J_on + J_off, each its own mean over every rank; None under any other correction (weight 1).
    `lanpo.rl.replay.separate_term_weights` weighs the rows, given the minibatch's counts over every rank (tokens for
    token-mean, sequences for seq-mean)."""
    if rows.correction != "separate":
        return None
    replayed, mask_mb = rows.replayed[mb], mask[mb]
    if agg == "token-mean":
        size = mask_mb.sum(dim=1).float()  # (M,) tokens of each row
    else:
        size = torch.ones(len(mb), dtype=torch.float32, device=mask.device)
    local = torch.stack([size[~replayed].sum(), size[replayed].sum()]).double().cpu()
    on, off = dist.all_reduce_sum(local).tolist()  # the minibatch's fresh and replayed counts over every rank
    weights = torch.ones(rows.replayed.shape[0], dtype=torch.float32, device=mask.device)
    weights[mb] = separate_term_weights(replayed.cpu(), mask_mb.cpu(), agg, on, off).to(mask.device)  # type: ignore[arg-type]
    return weights
