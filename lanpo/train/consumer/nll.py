"""MEL's NLL term of an update (J = J_GRPO + lambda * J_NLL): its examples and their backward.

Split out of `lanpo.train.consumer.update`, which calls `nll_backward` at the start of each minibatch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from lanpo.rl.loss import nll_sum_of
from lanpo.train.forward.batch import RolloutBatch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.plumbing.dist import Dist


@dataclass
class NLLTerm:
    """The NLL examples of this rank (targets as completions after their prompts; None: none on this rank, which
    still takes part, since token counts are global) and lambda, the term's weight."""

    batch: RolloutBatch | None
    coef: float


def nll_backward(
    model: Any,
    batch: RolloutBatch | None,
    index: torch.Tensor,
    coef: float,
    logprob_settings: LogprobSettings,
    dist: Dist,
    filler: RolloutBatch | None = None,
) -> tuple[float, float]:
    """Backward of `coef` * the token-mean NLL of `batch[index]` over every rank's share; returns (that NLL, its
    global token count). Nothing runs when no rank has a token (every rank sees the same count).

    `logprob_settings`: the update's, `micro_batch_size` rows a forward (no token budget), at temperature 1 (the
    examples' own likelihood, whatever the rollouts were sampled at).

    `filler` (one row of any batch): the model's forwards are collectives (FSDP), so every rank runs as many
    micro-batches as the rank with the most, a rank short of examples running `filler` with weight 0 (its
    gradient is exactly 0, and the all-gathers and reduce-scatters of the ranks line up)."""
    local = 0.0 if batch is None or index.numel() == 0 else float(batch.completion_mask[index].sum())
    tokens = dist.all_reduce_sum(torch.tensor([local], dtype=torch.float64)).item()
    if tokens == 0:
        return 0.0, 0.0
    micro = logprob_settings.micro_batch_size
    at_one = replace(logprob_settings, temperature=1.0)
    starts = list(range(0, len(index) if batch is not None else 0, micro))
    rounds = len(starts)
    if filler is not None:
        rounds = int(dist.all_reduce_max(torch.tensor([rounds])).item())
    nll_sum = 0.0
    for r in range(rounds):
        if r < len(starts):
            sub = batch.select(index[starts[r] : starts[r] + micro].to(batch.input_ids.device))  # type: ignore[union-attr]
            weight = coef * dist.world / tokens  # times the world size: DDP and FSDP average the ranks' gradients
        else:
            sub, weight = filler, 0.0  # type: ignore[assignment]
        logp, _ = completion_logprobs(model, sub, False, at_one)  # (m, T)
        summed = nll_sum_of(logp, sub.completion_mask)
        (summed * weight).backward()
        nll_sum += float(summed.detach()) if weight else 0.0
    return dist.all_reduce_sum(torch.tensor([nll_sum], dtype=torch.float64)).item() / tokens, tokens
