"""Group-normalised advantages (GRPO): each rollout's reward relative to the other rollouts of its prompt."""

from __future__ import annotations

import torch

ZERO_SPREAD = 1e-6


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """`(r - mean_group) / (std_group + eps)` for rewards laid out group by group.

    rewards: (G*n,) with the n rollouts of group g at positions g*n .. g*n+n-1.
    Returns (G*n,). std is the unbiased sample std (as torch.std and TRL); a group whose rewards have
    zero spread gets advantage exactly 0 (nothing to learn from it, and no division by ~0).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (G*n,), got shape {tuple(rewards.shape)}")
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size} (need n >= 2)")
    grouped = rewards.float().view(-1, group_size)  # (G, n)
    mean = grouped.mean(dim=1, keepdim=True)  # (G, 1)
    std = grouped.std(dim=1, keepdim=True)  # (G, 1)
    adv = (grouped - mean) / (std + eps)  # (G, n)
    adv = torch.where(std < ZERO_SPREAD, torch.zeros_like(adv), adv)
    return adv.view(-1)
