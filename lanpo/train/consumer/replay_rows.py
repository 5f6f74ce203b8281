"""The replayed rows of an update's batch (`[replay]`): which rows, their stored behaviour log-probs, the correction.

`lanpo.train.consumer.update` hands a micro-batch with replayed rows to `lanpo.rl.replay_loss.replay_policy_loss`
instead of `policy_loss`; without replayed rows it never comes here, so an update without replay is the update it
always was, bit for bit. Under `correction = "separate"` (RePO) each minibatch's fresh and replayed rows are two
terms, each its own token-mean (or seq-mean) over every rank: `term_weights` gives each row the weight that makes
the minibatch's one aggregate equal their sum.

Which minibatch a replayed row trains in (`minibatch_blocks`): the one its group's fresh rows train in. The
replay sources join stored trajectories to the fresh group of their problem and train them with it: RLEP appends
them to the group in the rollout worker (`_repeat_interleave(idx, self.sampling_params.n + replay_num)`) and ExGRPO
makes the replayed trajectory one of the question's n samples, so that in both the minibatches of verl's update,
consecutive blocks of the batch, carry a group's replays with the group. With one PPO epoch the fresh minibatches are
consecutive blocks of whole groups (`grpo.minibatch_size` counts whole groups on every rank), so a replayed row of
group g of a rank's G goes to minibatch floor(g * M / G) of M; over every rank, minibatch j is then the single
process's minibatch j, replays included. With several epochs the fresh rows are shuffled row by row each epoch, a
group no longer has one minibatch, and the replayed rows are shuffled likewise and split evenly over the minibatches
(each takes its share of them, as of the fresh rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanpo.rl.replay_loss import separate_term_weights
from lanpo.train.plumbing.dist import Dist


@dataclass(frozen=True)
class ReplayRows:
    """Which rows of a batch (B,) are replayed, their stored behaviour log-probs (B, T; 0 on fresh rows), the
    correction with its shaping constant (`ReplayConfig`), the group each row belongs to (B,; a replayed row's is the
    group it joins) and how many fresh groups this rank holds. Under torchrun every rank passes one (a rank may hold
    no replayed row of the step): the update then lines the ranks' micro-batches up."""

    replayed: torch.Tensor  # (B,) bool
    behaviour: torch.Tensor  # (B, T)
    correction: str
    shaping: float
    group: torch.Tensor  # (B,) long, in [0, groups)
    groups: int  # fresh groups on this rank

    def select(self, index: torch.Tensor) -> ReplayRows:
        return ReplayRows(
            self.replayed[index], self.behaviour[index], self.correction, self.shaping, self.group[index], self.groups
        )


def minibatch_blocks(rows: ReplayRows, order: torch.Tensor, n_minibatches: int, shuffled: bool) -> list[torch.Tensor]:
    """An epoch's minibatches (M,) of row indices from `order` (B,), a permutation of the batch's rows: the fresh rows
    as the update cuts them without replay (`n_minibatches` consecutive blocks of `order`'s fresh rows), each followed
    by its replayed rows in `order`'s order. `shuffled` (several epochs): an even share of the replayed rows; else
    those of the block's groups (group g of G in block floor(g * M / G)). See the module docstring for why."""
    replayed = rows.replayed.cpu()[order]  # (B,) in the order's order
    fresh, replays = order[~replayed], order[replayed]
    blocks = torch.tensor_split(fresh, n_minibatches)
    if shuffled:
        shares = torch.tensor_split(replays, n_minibatches)
    else:
        block_of = rows.group.cpu()[replays] * n_minibatches // max(rows.groups, 1)  # (R,)
        shares = tuple(replays[block_of == j] for j in range(n_minibatches))
    return [torch.cat([f, r]) for f, r in zip(blocks, shares, strict=True)]


def term_weights(rows: ReplayRows, mask: torch.Tensor, mb: torch.Tensor, agg: str, dist: Dist) -> torch.Tensor | None:
    """(B,) weights over the whole batch for minibatch `mb` (M,) under `separate`, so that the minibatch's one
    aggregate equals J_on + J_off, each its own mean over every rank; None under any other correction (weight 1).
    `lanpo.rl.replay_loss.separate_term_weights` weighs the rows, given the minibatch's counts over every rank (tokens
    for token-mean, sequences for seq-mean)."""
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
