"""An update that learns nothing (every group skipped under `grpo.skip_zero_spread`): the schedule kept on time,
the batch's KL and entropy measured (lanpo.train.consumer.update's `_nothing_to_learn`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from lanpo.rl.loss import kl_k3
from lanpo.train.forward.batch import RolloutBatch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.policy import Policy


def skip_update(optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """An optimizer step with no gradient (moves nothing) and a schedule step: the schedule stays on time."""
    optimizer.zero_grad(set_to_none=True)
    optimizer.step()
    scheduler.step()


def measure_only(policy: Policy, batch: RolloutBatch, logprob_settings: LogprobSettings) -> dict[str, float]:
    """KL and entropy of a batch nothing was learned from (every group skipped): no gradient, no step. Also
    returns the seconds of its reference pass (`ref`) and of its policy pass (`policy`): a step that learns
    nothing still spends them. Both passes take `logprob_settings.micro_batch_size` rows a forward (no token
    budget)."""
    micro = logprob_settings.micro_batch_size
    kl_sum = entropy_sum = tokens = 0.0
    started = time.perf_counter()
    ref = policy.reference_logprobs(batch, replace(logprob_settings, max_tokens=0))
    seconds_ref = time.perf_counter() - started
    with torch.no_grad():
        for start in range(0, batch.size, micro):
            sub = batch.select(slice(start, start + micro))
            logp, entropy = completion_logprobs(policy.model, sub, True, logprob_settings)
            mask = sub.completion_mask.float()
            kl_sum += float((kl_k3(logp, ref[start : start + micro]) * mask).sum())
            entropy_sum += float((entropy * mask).sum())  # type: ignore[operator]
            tokens += float(mask.sum())
    return {
        "kl": kl_sum / max(tokens, 1.0),
        "entropy": entropy_sum / max(tokens, 1.0),
        "ref": seconds_ref,
        "policy": time.perf_counter() - started - seconds_ref,
    }
