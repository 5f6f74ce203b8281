"""Group-normalised advantages (GRPO): each rollout's reward relative to the other rollouts of its prompt.

Against verl's `compute_grpo_outcome_advantage` (`verl/trainer/ppo/core_algos.py`, volcengine/verl b178a3c; the
paper trains with verl, whose default estimator "grpo" is this function):

    id2mean[idx] = torch.mean(scores_tensor)
    id2std[idx] = torch.std(scores_tensor)
    ...
    scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)      # epsilon: float = 1e-6

- The same formula, the same unbiased std (`torch.std`, n - 1) and the same epsilon, 1e-6 (TRL uses 1e-4,
  lanpo did before: the two differ by a factor (std + 1e-4) / (std + 1e-6), 1.003 at n = 8 and 1.004 at 16 for
  the smallest spread a lanpo reward gives, one 1.1 among 1.0s).
- Departure: a group whose rewards have zero spread gets advantage exactly 0 here. verl divides whatever
  `r - mean` is by (std + 1e-6): 0 when the float32 mean is exact, as it is for rewards 0 and 1 and for 1.1 at
  n = 8 or 16 (the paper's group size), but not for 1.1 (correct and formatted) at n = 10-15 or 20-24, where a
  rounding error of ~1e-7 makes every rollout's advantage -0.106 (measured): a push against a group of right
  answers with no signal in it.
- Departure: verl gives a group of one rollout mean 0 and std 1 (advantage = reward); lanpo refuses n < 2.
"""

from __future__ import annotations

import torch

ZERO_SPREAD = 1e-6
EPS = 1e-6  # verl's `epsilon` default in compute_grpo_outcome_advantage


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """`(r - mean_group) / (std_group + eps)` for rewards laid out group by group.

    rewards: (G*n,) with the n rollouts of group g at positions g*n .. g*n+n-1.
    Returns (G*n,). std is the unbiased sample std (as torch.std, verl and TRL); a group whose rewards have
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
