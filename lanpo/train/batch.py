"""Rollouts -> padded tensors, and the batched forward that turns them into per-token log-probs.

Layout (as TRL): prompts left-padded to P, completions right-padded to T, so every completion starts at column
P. The forward keeps logits for the last T + 1 positions only (`logits_to_keep`), which skips the vocabulary
projection over prompt tokens -- on a 135M model with a 49k vocabulary that projection is a large share of the
cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lanpo.rl.logprobs import entropy_from_logits, token_logprobs


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


def completion_logprobs(
    model: Any, batch: RolloutBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p of the completion tokens (B, T), and optionally the entropy (B, T, detached)."""
    T = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, T, V): position P-1+t predicts completion token t
    logp = token_logprobs(logits, batch.completion_ids)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())  # (B, T)
    return logp, entropy


@torch.no_grad()
def chunked_logprobs(model: Any, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """log p of the completion tokens (B, T) without gradients, `micro_batch_size` sequences per forward.

    The reference's log-probs (`Policy.reference_logprobs` runs it on the reference), and old_logp when several
    updates reuse the rollouts.
    """
    parts = []
    for start in range(0, batch.size, micro_batch_size):
        logp, _ = completion_logprobs(model, batch.select(slice(start, start + micro_batch_size)))
        parts.append(logp)
    return torch.cat(parts)
