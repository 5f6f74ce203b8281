"""Per-token log-probabilities and entropies from logits (pure tensor functions)."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log p(token_ids[b, t] | ...) from logits (B, T, V) and ids (B, T) -> (B, T).

    logits[:, t] must already be the prediction *for* token_ids[:, t] (the caller shifts by one).
    Uses logsumexp + gather instead of a full log_softmax copy of (B, T, V).
    """
    logits = logits.float()
    picked = torch.gather(logits, dim=-1, index=token_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution: (B, T, V) -> (B, T)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
