"""The `[grpo]` table of a training config: the GRPO update (clip-higher, k3 KL, token-mean), its optimiser and
schedule, its micro-batches and log-prob chunks. Part of `TrainConfig` (lanpo.train.config).
"""

from __future__ import annotations

from dataclasses import dataclass

from lanpo.config import check as _check
from lanpo.config import help_field

AGGREGATIONS = ("token-mean", "seq-mean")
LR_SCHEDULES = ("cosine", "constant")  # after the warmup (lanpo.train.consumer.update.warmup_schedule)
AUTOCASTS = ("off", "bf16", "auto")  # grpo.autocast (lanpo.train.forward.batch.AUTOCAST_DTYPES maps them to dtypes)


@dataclass
class GRPOConfig:
    """The GRPO update (clip-higher, k3 KL, token-mean), optimiser and schedule."""

    learning_rate: float = help_field(1e-6, "AdamW learning rate (paper: 1e-6 full fine-tuning; LoRA wants ~1e-4)")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    warmup_ratio: float = help_field(0.1, "share of steps with linear warmup before the cosine decay (paper: 0.1)")
    lr_schedule: str = help_field("cosine", "after the warmup: cosine (decay to 0, paper) | constant")
    eps_low: float = help_field(0.2, "lower clip: ratio >= 1 - eps_low (paper: 0.2)")
    eps_high: float = help_field(0.28, "upper clip: ratio <= 1 + eps_high (paper: 0.28)")
    beta: float = help_field(5e-4, "KL penalty against the reference policy (paper: 5e-4)")
    loss_agg: str = help_field("token-mean", "token-mean (paper) | seq-mean")
    ppo_epochs: int = help_field(1, "passes over each step's rollouts")
    minibatch_size: int = help_field(
        0, "sequences per optimiser step over all ranks (0: the whole batch, one update per epoch)"
    )
    micro_batch_size: int = help_field(8, "sequences per forward/backward (gradient accumulation inside a minibatch)")
    max_tokens_per_micro_batch: int = help_field(
        0,
        "token-budgeted micro-batches: consecutive rows of a minibatch up to this many real (unpadded) prompt + "
        "completion tokens, never more than micro_batch_size rows (verl's ppo_max_token_len_per_gpu; 0: "
        "micro_batch_size rows each); the loss is the same token-mean",
    )
    logprob_chunk_mb: int = help_field(
        256,
        "MiB the log-prob head's logits may hold at once: a micro-batch whose full logits would hold more takes "
        "its positions in chunks of this / (vocabulary x 8 bytes; 16 unfused), each recomputed in backward, so "
        "log-prob memory is bounded at every shape (0: off, the full logits)",
    )
    logprob_chunk_tokens: int = help_field(
        0,
        "chunks of this many completion positions instead of logprob_chunk_mb's, when a micro-batch has more "
        "(rows x columns) than this (0: chunks sized by logprob_chunk_mb)",
    )
    logprob_fused: bool = help_field(
        True,
        "chunks through one autograd function (head, log-softmax, gather) that keeps no logits for backward, for "
        "a plain linear head (false: the head's own forward under activation checkpointing, twice the memory a "
        "position)",
    )
    share_prompts: bool = help_field(
        True,
        "run each distinct prompt of a micro-batch once and its completions on its cache (the same log-probs to "
        "float rounding; false: every row whole, as runs before it)",
    )
    autocast: str = help_field(
        "off",
        "off | bf16 | auto: the trainer computes in bf16 over fp32 master weights, the log-softmax in fp32: full "
        "fine-tuning under torchrun through FSDP2 mixed precision (bf16 units, fp32 gradient reduction, as verl), "
        "otherwise under torch.autocast (faster on CPUs with fast bf16 matmuls and on GPUs; log-probs differ by "
        "bf16 rounding); auto: bf16 where a bf16 matmul measures at least 1.25x faster than fp32 on this machine "
        "(models.bf16_pays)",
    )
    max_grad_norm: float = help_field(1.0, "gradient clipping")
    skip_zero_spread: bool = help_field(
        False, "drop groups with zero reward spread from the update (DAPO-style; saves their forward/backward)"
    )
    tis_cap: float | None = help_field(
        None,
        "truncated importance sampling cap on exp(logp_trainer - logp_engine), rollout.backend = vllm only "
        "(None: no correction; engine/logp_abs_diff says how far the engine is)",
    )
    dual_clip: float | None = help_field(
        None,
        "dual-clip PPO: a negative-advantage token's loss is at most -A * dual_clip, bounding the ratio the clip "
        "leaves open above 1 + eps_high (verl's clip_ratio_c, default 3.0 there; None: off)",
    )

    def __post_init__(self) -> None:
        _check(self.learning_rate > 0, f"grpo.learning_rate must be > 0, got {self.learning_rate}")
        _check(0 <= self.warmup_ratio < 1, f"grpo.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        _check(
            self.lr_schedule in LR_SCHEDULES,
            f"grpo.lr_schedule must be cosine or constant, got {self.lr_schedule!r}",
        )
        _check(0 <= self.eps_low < 1, f"grpo.eps_low must be in [0, 1), got {self.eps_low}")
        _check(
            self.eps_high >= self.eps_low,
            f"grpo.eps_high ({self.eps_high}) must be >= grpo.eps_low ({self.eps_low})",
            "clip-higher widens the upper bound only; set eps_high >= eps_low",
        )
        _check(self.beta >= 0, f"grpo.beta must be >= 0, got {self.beta}")
        _check(self.loss_agg in AGGREGATIONS, f"grpo.loss_agg must be token-mean or seq-mean, got {self.loss_agg!r}")
        _check(self.ppo_epochs >= 1, f"grpo.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        _check(self.minibatch_size >= 0, f"grpo.minibatch_size must be >= 0, got {self.minibatch_size}")
        _check(self.micro_batch_size >= 1, f"grpo.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        _check(
            self.max_tokens_per_micro_batch >= 0,
            f"grpo.max_tokens_per_micro_batch must be >= 0, got {self.max_tokens_per_micro_batch}",
            "0 keeps micro_batch_size rows per micro-batch",
        )
        _check(
            self.logprob_chunk_tokens >= 0,
            f"grpo.logprob_chunk_tokens must be >= 0, got {self.logprob_chunk_tokens}",
            "0 sizes the chunks by grpo.logprob_chunk_mb",
        )
        _check(
            self.logprob_chunk_mb >= 0,
            f"grpo.logprob_chunk_mb must be >= 0, got {self.logprob_chunk_mb}",
            "0 turns the chunked log-prob off",
        )
        _check(self.autocast in AUTOCASTS, f"grpo.autocast must be off, bf16 or auto, got {self.autocast!r}")
        _check(self.max_grad_norm > 0, f"grpo.max_grad_norm must be > 0, got {self.max_grad_norm}")
        _check(self.tis_cap is None or self.tis_cap >= 1.0, f"grpo.tis_cap must be >= 1 or unset, got {self.tis_cap}")
        _check(
            self.dual_clip is None or self.dual_clip > 1.0,
            f"grpo.dual_clip must be > 1 or unset, got {self.dual_clip}",
            "it holds a negative-advantage token's loss once its ratio passes dual_clip; at <= 1 it would hold them "
            "on-policy (ratio 1) and take their gradient away. verl asserts clip_ratio_c > 1 and defaults to 3.0",
        )
