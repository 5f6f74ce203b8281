"""Rollouts as padded tensors, and the pieces every forward over them shares.

Layout (as TRL): prompts left-padded to P, completions right-padded to T, so every completion starts at column
P. The forwards (`lanpo.train.forward.logprobs`) keep logits for the completion positions only.

Shared prompts: a GRPO group is n completions of one prompt, so the forwards run each distinct prompt once
(`prompts_forward`) where the model allows it; `shared_prompts` finds them, after dropping the columns that pad
every row.

`autocast` (`grpo.autocast`): the model's forwards run under `torch.autocast` in that dtype (bf16), the weights
staying fp32 (`forward_precision`); the logits are upcast to fp32 before the log-softmax and the entropy, and
backward runs outside the autocast context, as PyTorch recommends. Faster where bf16 matmuls are (AVX512-BF16 or
AMX CPUs, GPUs); the log-probs differ from fp32 by bf16 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from lanpo.models import bf16_pays, default_device
from lanpo.train.plumbing import fsdp


@dataclass
class RolloutBatch:
    """B sequences = prompt (left-padded to P) + completion (right-padded to T)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    position_ids: torch.Tensor  # (B, P + T)
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) 1 = a generated token (EOS included)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        return RolloutBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.position_ids[index],
            self.completion_ids[index],
            self.completion_mask[index],
        )


def build_batch(
    prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> RolloutBatch:
    """Pad prompts on the left and completions on the right (an empty completion keeps one masked pad)."""
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    B = len(prompt_ids)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        input_ids[b, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[b, P - len(p) : P] = 1
        if c:
            input_ids[b, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attention[b, P : P + len(c)] = 1
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)  # (B, P + T)
    completion_mask = attention[:, P:].clone()  # (B, T)
    return RolloutBatch(
        input_ids.to(device),
        attention.to(device),
        position_ids.to(device),
        input_ids[:, P:].to(device),
        completion_mask.to(device),
    )


AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"off": None, "bf16": torch.bfloat16}  # grpo.autocast


def autocast_dtype(setting: str, device: torch.device | None = None) -> torch.dtype | None:
    """`grpo.autocast` ("off" | "bf16" | "auto") as the dtype the forwards autocast to (None: none, plain fp32);
    "auto" is bf16 where a bf16 matmul measures faster than fp32 on `device`, where the forwards run (`bf16_pays`;
    default: the device the trainer would pick)."""
    if setting == "auto":
        return torch.bfloat16 if bf16_pays(device or default_device()) else None
    return AUTOCAST_DTYPES[setting]


def forward_precision(batch: RolloutBatch, autocast: torch.dtype | None) -> AbstractContextManager[Any]:
    """Around a model forward: `torch.autocast` to `autocast` on the batch's device, or nothing (None)."""
    if autocast is None:  # not even a disabled autocast: a caller's own autocast context stays in force
        return nullcontext()
    return torch.autocast(device_type=batch.input_ids.device.type, dtype=autocast)


def padding_columns(prompt_mask: torch.Tensor) -> int:
    """How many leading columns pad every row (prompts are left-padded)."""
    return int((prompt_mask.sum(dim=0) == 0).long().cumprod(dim=0).sum())


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U,) the first row of each distinct prompt, and (B,) which of them each row holds."""
    keys = torch.cat([prompt_ids, prompt_mask], dim=1)  # the mask too: a prompt may begin with the pad token
    _, rows = torch.unique(keys, dim=0, return_inverse=True)  # (B,) into the U sorted distinct rows
    first = torch.full((int(rows.max()) + 1,), keys.shape[0], dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, rows, torch.arange(keys.shape[0], device=rows.device), "amin")
    order = torch.argsort(first)  # the distinct prompts in the order they first appear
    return first[order], torch.argsort(order)[rows]


def can_share(model: Any) -> bool:
    """Whether prompts can run apart from their completions. The forward must return a key/value cache (not in
    training mode under gradient checkpointing). And not on an FSDP-sharded model: two forwards of its units
    before one backward gave other weights than the single process at 2 ranks (tests/train/test_multirank.py),
    so sharded full fine-tuning runs rows whole, its reference too (one rule, which a single process can match
    with `grpo.share_prompts = false`)."""
    if fsdp.is_sharded(model):
        return False
    return not (model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()))


def shared_prompts(
    model: Any, batch: RolloutBatch, share: bool
) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """(how many leading columns pad every row, the distinct prompts (U,), and which of them each row holds (B,)):
    the prompts only when `share` (`grpo.share_prompts`), the model allows it (`can_share`) and fewer than B are
    distinct (else None, None: every row runs whole)."""
    P = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    cut = padding_columns(batch.attention_mask[:, :P])
    if share and can_share(model):  # only then is it worth finding the distinct prompts
        prompts, rows = distinct_prompts(batch.input_ids[:, cut:P], batch.attention_mask[:, cut:P])
        if len(prompts) < batch.size:
            return cut, prompts, rows
    return cut, None, None


def prompts_forward(
    model: Any, batch: RolloutBatch, cut: int, prompts: torch.Tensor, autocast: torch.dtype | None
) -> Any:
    """The U distinct prompts (`prompts` (U,) row indices) in one forward, their cache kept and the logits of their
    last position alone (each predicts its rows' first completion token)."""
    P = batch.input_ids.shape[1] - batch.completion_ids.shape[1]
    with forward_precision(batch, autocast):
        return model(
            input_ids=batch.input_ids[prompts, cut:P],
            attention_mask=batch.attention_mask[prompts, cut:P],
            position_ids=batch.position_ids[prompts, cut:P],
            logits_to_keep=1,
            use_cache=True,
        )
