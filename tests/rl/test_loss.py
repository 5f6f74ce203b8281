"""Clipped GRPO loss, k3 KL and log-prob helpers against plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch

from lanpo.rl.logprobs import entropy_from_logits, token_logprobs
from lanpo.rl.loss import kl_k3, policy_loss


def policy_loss_reference(
    logp: list[list[float]],
    old_logp: list[list[float]],
    ref_logp: list[list[float]],
    advantages: list[float],
    mask: list[list[int]],
    eps_low: float,
    eps_high: float,
    beta: float,
    agg: str = "token-mean",
    behavior_logp: list[list[float]] | None = None,
    tis_cap: float | None = None,
) -> float:
    """Plain-loop reference of `policy_loss`'s value (compared with allclose)."""
    total, count, seq_means = 0.0, 0, []
    for b, adv in enumerate(advantages):
        seq_total, seq_count = 0.0, 0
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old_logp[b][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            pg = max(-adv * ratio, -adv * clipped)
            if tis_cap is not None:
                assert behavior_logp is not None
                pg *= min(math.exp(old_logp[b][t] - behavior_logp[b][t]), tis_cap)
            delta = ref_logp[b][t] - logp[b][t]
            value = pg + beta * (math.exp(delta) - delta - 1)
            total, count = total + value, count + 1
            seq_total, seq_count = seq_total + value, seq_count + 1
        seq_means.append(seq_total / max(seq_count, 1))
    return total / max(count, 1) if agg == "token-mean" else sum(seq_means) / len(seq_means)


def _batch(seed: int, b: int = 4, t: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3
    return {
        "logp": logp,
        "old_logp": logp + (torch.rand(b, t, generator=g) - 0.5) * 0.8,  # ratios well outside the clip range
        "ref_logp": logp + (torch.rand(b, t, generator=g) - 0.5),
        "advantages": torch.randn(b, generator=g),
        "mask": (torch.rand(b, t, generator=g) > 0.3).long(),
    }


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
@pytest.mark.parametrize("seed", range(5))
def test_policy_loss_matches_plain_loop(agg: str, seed: int) -> None:
    batch = _batch(seed)
    batch["mask"][:, 0] = 1  # no empty sequence
    loss, _ = policy_loss(**batch, eps_low=0.2, eps_high=0.28, beta=0.05, agg=agg)  # type: ignore[arg-type]
    want = policy_loss_reference(
        batch["logp"].tolist(),
        batch["old_logp"].tolist(),
        batch["ref_logp"].tolist(),
        batch["advantages"].tolist(),
        batch["mask"].tolist(),
        0.2,
        0.28,
        0.05,
        agg,  # type: ignore[arg-type]
    )
    assert math.isclose(loss.item(), want, rel_tol=1e-5, abs_tol=1e-6)


def test_on_policy_gradient_is_advantage_weighted() -> None:
    # ratio == 1 (old == logp, detached): d loss / d logp_t = -A / N for every unmasked token.
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -0.1]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = policy_loss(logp, logp.detach(), None, adv, mask, beta=0.0)
    loss.backward()
    expected = torch.tensor([[-2.0, -2.0, 0.0], [1.0, 1.0, 1.0]]) / 5
    assert torch.allclose(logp.grad, expected)
    assert stats["clip_frac"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(1.0)


def test_clip_fraction_counts_only_active_clips() -> None:
    logp = torch.zeros(2, 2)
    old = torch.tensor([[-1.0, 1.0], [-1.0, 1.0]])  # ratios e and 1/e
    adv = torch.tensor([1.0, -1.0])
    _, stats = policy_loss(logp, old, None, adv, torch.ones(2, 2), beta=0.0)
    # row 0 (A>0): ratio e > 1.28 clipped; 1/e < 0.8 is not (min branch). Row 1 (A<0): the opposite.
    assert stats["clip_frac"].item() == pytest.approx(0.5)


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere() -> None:
    a = torch.tensor([-1.0, -2.0, -3.0])
    assert torch.equal(kl_k3(a, a), torch.zeros(3))
    assert (kl_k3(a, a + 0.3) > 0).all() and (kl_k3(a, a - 0.3) > 0).all()


def test_beta_needs_reference() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError):
        policy_loss(x, x, None, torch.ones(1), torch.ones(1, 2), beta=0.1)


def test_token_logprobs_and_entropy_match_log_softmax_loop() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g)
    ids = torch.randint(0, 11, (2, 3), generator=g)
    got = token_logprobs(logits, ids)
    ent = entropy_from_logits(logits)
    for b in range(2):
        for t in range(3):
            row = torch.log_softmax(logits[b, t], dim=-1)
            assert torch.isclose(got[b, t], row[ids[b, t]], atol=1e-5)
            assert torch.isclose(ent[b, t], -(row.exp() * row).sum(), atol=1e-5)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_truncated_importance_sampling_matches_plain_loop(agg: str, seed: int) -> None:
    batch = _batch(seed)
    batch["mask"][:, 0] = 1
    g = torch.Generator().manual_seed(100 + seed)
    behavior = batch["old_logp"] + (torch.rand(batch["logp"].shape, generator=g) - 0.5) * 0.6  # engine vs trainer
    loss, stats = policy_loss(
        **batch, eps_low=0.2, eps_high=0.28, beta=0.05, agg=agg, behavior_logp=behavior, tis_cap=1.2
    )  # type: ignore[arg-type]
    want = policy_loss_reference(
        batch["logp"].tolist(), batch["old_logp"].tolist(), batch["ref_logp"].tolist(),
        batch["advantages"].tolist(), batch["mask"].tolist(), 0.2, 0.28, 0.05, agg,
        behavior.tolist(), 1.2,
    )  # fmt: skip
    assert math.isclose(loss.item(), want, rel_tol=1e-5, abs_tol=1e-6)
    assert 0 < stats["tis_weight"].item() <= 1.2
    plain, plain_stats = policy_loss(**batch, eps_low=0.2, eps_high=0.28, beta=0.05, agg=agg)  # type: ignore[arg-type]
    assert plain_stats["tis_weight"].item() == 1.0 and not math.isclose(plain.item(), loss.item())
    # engine and trainer agreeing exactly: TIS is the plain loss
    same, _ = policy_loss(
        **batch, eps_low=0.2, eps_high=0.28, beta=0.05, agg=agg, behavior_logp=batch["old_logp"], tis_cap=2.0
    )  # type: ignore[arg-type]
    assert torch.allclose(same, plain)
