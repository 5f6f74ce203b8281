"""Group advantages against the plain-loop reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.rl.advantages import EPS, ZERO_SPREAD, group_advantages


def group_advantages_reference(rewards: list[float], group_size: int, eps: float = 1e-6) -> list[float]:
    """Plain-loop reference of `group_advantages`."""
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        var = sum((r - mean) ** 2 for r in group) / (len(group) - 1)
        std = var**0.5
        for r in group:
            out.append(0.0 if std < ZERO_SPREAD else (r - mean) / (std + eps))
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=6),
    groups=st.integers(min_value=1, max_value=5),
    data=st.data(),
)
def test_matches_plain_loop(n: int, groups: int, data: st.DataObject) -> None:
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.1, 1.0, 1.1, 0.5]), min_size=n * groups, max_size=n * groups))
    got = group_advantages(torch.tensor(rewards), n)
    want = torch.tensor(group_advantages_reference(rewards, n))
    assert torch.allclose(got, want, atol=1e-5)


def test_zero_spread_group_gets_zero_and_others_are_normalised() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    adv = group_advantages(rewards, 4)
    assert torch.equal(adv[:4], torch.zeros(4))
    assert adv[5] > 0 > adv[4]
    assert abs(adv[4:].sum().item()) < 1e-6
    # unbiased std of [0,1,0,1] is 0.57735: advantage of a 1 is 0.5 / 0.57735
    assert adv[5].item() == pytest.approx(0.5 / (0.57735027 + 1e-6), rel=1e-6)


def test_epsilon_is_verls() -> None:
    # verl's compute_grpo_outcome_advantage(..., epsilon: float = 1e-6, ...): (r - mean) / (torch.std + epsilon)
    assert EPS == 1e-6
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.1])
    std = torch.std(rewards)
    assert torch.equal(group_advantages(rewards, 4), (rewards - rewards.mean()) / (std + 1e-6))


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4), 1)
