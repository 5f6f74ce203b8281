"""How the trainer's forwards turn a batch into per-token log-probs, as one value: `LogprobSettings`.

Built once from `[grpo]` (`LogprobSettings.from_grpo`, with the rollouts' temperature and the device the forwards
run on) and passed whole: to `lanpo.train.forward.logprobs` (`completion_logprobs`, `chunked_logprobs`), to the
chunked head (`lanpo.train.forward.chunked`) and to the policy's reference pass (`Policy.reference_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanpo.train.forward.batch import autocast_dtype
from lanpo.train.forward.chunking import NO_CHUNKS, Chunking
from lanpo.train.grpo_config import GRPOConfig


@dataclass(frozen=True)
class LogprobSettings:
    """The log-prob forwards' settings. The defaults (`PLAIN_LOGPROBS`): each distinct prompt run once, no
    autocast, T = 1, no token budget, the full logits; `grpo.micro_batch_size`'s default rows a forward."""

    micro_batch_size: int = GRPOConfig.micro_batch_size  # sequences a forward (`chunked_logprobs`)
    share_prompts: bool = True  # run each distinct prompt once (`grpo.share_prompts`; False: every row whole)
    autocast: torch.dtype | None = None  # the forwards under `torch.autocast` in this dtype (None: the weights')
    temperature: float = 1.0  # log-probs of softmax(logits / temperature): the rollouts' (`rollout.temperature`)
    max_tokens: int = 0  # token-budgeted micro-batches (`grpo.max_tokens_per_micro_batch`; 0: rows alone)
    chunking: Chunking = NO_CHUNKS  # the head's logits a chunk of positions at a time (`Chunking.of`)

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    @classmethod
    def from_grpo(cls, cfg: GRPOConfig, *, temperature: float, device: torch.device | None = None) -> LogprobSettings:
        """`[grpo]`'s log-prob settings at the rollouts' `temperature`, its autocast resolved for `device`, where
        the forwards run ("auto" measures there: `autocast_dtype`)."""
        return cls(
            micro_batch_size=cfg.micro_batch_size,
            share_prompts=cfg.share_prompts,
            autocast=autocast_dtype(cfg.autocast, device),
            temperature=temperature,
            max_tokens=cfg.max_tokens_per_micro_batch,
            chunking=Chunking.of(cfg),
        )


PLAIN_LOGPROBS = LogprobSettings()  # the default of the functions that take a LogprobSettings
