"""Clipped GRPO loss (dual clip included), k3 KL and log-prob helpers against plain-loop references, and the loss
without a dual clip against the formula it had before the dual clip and verl's clamps existed, bit for bit."""

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
    dual_clip: float | None = None,
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
            if dual_clip is not None and adv < 0:
                pg = min(pg, -adv * dual_clip)  # verl: min(pg_losses3, clip_pg_losses1) where A < 0
            if tis_cap is not None:
                assert behavior_logp is not None
                pg *= min(math.exp(old_logp[b][t] - behavior_logp[b][t]), tis_cap)
            value = pg + beta * kl_k3_reference(logp[b][t], ref_logp[b][t])
            total, count = total + value, count + 1
            seq_total, seq_count = seq_total + value, seq_count + 1
        seq_means.append(seq_total / max(seq_count, 1))
    return total / max(count, 1) if agg == "token-mean" else sum(seq_means) / len(seq_means)


def kl_k3_reference(logp: float, ref_logp: float) -> float:
    """verl's "low_var_kl" for one token: ref - logp clamped to [-20, 20], the k3 estimate to [-10, 10]."""
    delta = min(max(ref_logp - logp, -20.0), 20.0)
    return min(max(math.exp(delta) - delta - 1, -10.0), 10.0)


def policy_loss_gradient_reference(
    logp: list[list[float]],
    old_logp: list[list[float]],
    ref_logp: list[list[float]],
    advantages: list[float],
    mask: list[list[int]],
    eps_low: float,
    eps_high: float,
    beta: float,
    agg: str,
    behavior_logp: list[list[float]] | None = None,
    tis_cap: float | None = None,
    dual_clip: float | None = None,
) -> list[list[float]]:
    """d loss / d logp token by token, by hand: the branch that is active decides (a clipped or dual-clipped
    branch is constant in logp, the unclipped one is -A * ratio, the TIS weight is a constant factor), plus
    beta * d k3 / d logp = beta * (1 - exp(ref - logp)) inside verl's clamps, 0 outside them."""
    counts = [sum(row) for row in mask]
    total = sum(counts)
    grad = [[0.0] * len(row) for row in logp]
    for b, adv in enumerate(advantages):
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old_logp[b][t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            unclipped_active = -adv * ratio >= -adv * clipped  # equal inside the clip range, where both move
            pg = max(-adv * ratio, -adv * clipped)
            d_pg = -adv * ratio if unclipped_active else 0.0
            if dual_clip is not None and adv < 0 and pg > -adv * dual_clip:
                d_pg = 0.0  # held at -A * c
            if tis_cap is not None:
                assert behavior_logp is not None
                d_pg *= min(math.exp(old_logp[b][t] - behavior_logp[b][t]), tis_cap)
            delta = ref_logp[b][t] - logp[b][t]
            inside = abs(delta) < 20 and -10 < math.exp(delta) - delta - 1 < 10
            d_kl = 1 - math.exp(delta) if inside else 0.0
            weight = 1 / total if agg == "token-mean" else 1 / (len(advantages) * counts[b])
            grad[b][t] = weight * (d_pg + beta * d_kl)
    return grad


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


def _off_policy_batch(seed: int, b: int = 6, t: int = 9) -> dict[str, torch.Tensor]:
    """Far off-policy: logp - old_logp in [-2, 2], ratios from 0.14 to 7.4 (well above the dual clip's 3 and below
    1 - eps_low), advantages of both signs, every sequence with a token."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3
    advantages = torch.randn(b, generator=g)
    advantages[: b // 2] = -advantages[: b // 2].abs()  # both signs, whatever the draw
    advantages[b // 2 :] = advantages[b // 2 :].abs()
    mask = (torch.rand(b, t, generator=g) > 0.25).long()
    mask[:, 0] = 1
    return {
        "logp": logp,
        "old_logp": logp - (torch.rand(b, t, generator=g) - 0.5) * 4,
        "ref_logp": logp + (torch.rand(b, t, generator=g) - 0.5),
        "advantages": advantages,
        "mask": mask,
    }


@pytest.mark.parametrize("tis", [False, True], ids=["plain", "tis"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_dual_clip_loss_and_gradient_match_plain_loop(seed: int, agg: str, tis: bool) -> None:
    batch = _off_policy_batch(seed)
    g = torch.Generator().manual_seed(50 + seed)
    behavior = batch["old_logp"] + (torch.rand(batch["logp"].shape, generator=g) - 0.5) * 0.6 if tis else None
    tis_cap = 1.5 if tis else None
    logp = batch["logp"].clone().requires_grad_(True)
    loss, stats = policy_loss(
        logp, batch["old_logp"], batch["ref_logp"], batch["advantages"], batch["mask"], 0.2, 0.28, 0.05,
        agg, behavior_logp=behavior, tis_cap=tis_cap, dual_clip=3.0,
    )  # type: ignore[arg-type]  # fmt: skip
    loss.backward()
    lists = [batch[k].tolist() for k in ("logp", "old_logp", "ref_logp", "advantages", "mask")]
    extra = (None if behavior is None else behavior.tolist(), tis_cap, 3.0)
    want = policy_loss_reference(*lists, 0.2, 0.28, 0.05, agg, *extra)
    want_grad = torch.tensor(policy_loss_gradient_reference(*lists, 0.2, 0.28, 0.05, agg, *extra))
    assert math.isclose(loss.item(), want, rel_tol=1e-5, abs_tol=1e-6)
    assert torch.allclose(logp.grad, want_grad, rtol=1e-5, atol=1e-7)

    # The dual clip binds here (else this test would not test it), and the stat counts exactly where it does.
    ratio = torch.exp(batch["logp"] - batch["old_logp"])
    adv = batch["advantages"][:, None]
    held = (adv < 0) & (-adv * torch.maximum(ratio, torch.tensor(0.8)) > -adv * 3.0) & batch["mask"].bool()
    assert held.sum() >= 3 and ((ratio < 0.8) & (adv < 0) & batch["mask"].bool()).any()
    assert stats["dual_clip_frac"].item() == pytest.approx(held.sum().item() / batch["mask"].sum().item())
    # Without the dual clip those tokens pull: the loss differs.
    plain, plain_stats = policy_loss(
        batch["logp"], batch["old_logp"], batch["ref_logp"], batch["advantages"], batch["mask"], 0.2, 0.28, 0.05,
        agg, behavior_logp=behavior, tis_cap=tis_cap,
    )  # type: ignore[arg-type]  # fmt: skip
    assert plain.item() > loss.item() and plain_stats["dual_clip_frac"].item() == 0.0


def _loss_before_dual_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    behavior_logp: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.05,
    tis_cap: float = 1.5,
) -> torch.Tensor:
    """`policy_loss` as it was before `dual_clip` and verl's clamps, op for op (token-mean)."""
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    weight = torch.exp(old_logp.detach() - behavior_logp).clamp(max=tis_cap).detach()
    pg = pg * weight
    delta = ref_logp - logp
    per_token = pg + beta * (torch.exp(delta) - delta - 1.0)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


@pytest.mark.parametrize("seed", range(3))
def test_without_dual_clip_the_loss_and_gradient_are_what_they_were_bit_for_bit(seed: int) -> None:
    """dual_clip None, and every log-ratio inside verl's clamps (as any real run's): the same bits as before."""
    batch = _off_policy_batch(seed)
    behavior = batch["old_logp"] + 0.1
    got_logp = batch["logp"].clone().requires_grad_(True)
    was_logp = batch["logp"].clone().requires_grad_(True)
    rest = (batch["old_logp"], batch["ref_logp"], batch["advantages"], batch["mask"])
    got, _ = policy_loss(got_logp, *rest, 0.2, 0.28, 0.05, "token-mean", behavior_logp=behavior, tis_cap=1.5)
    was = _loss_before_dual_clip(was_logp, *rest, behavior_logp=behavior)
    got.backward()
    was.backward()
    assert torch.equal(got, was) and torch.equal(got_logp.grad, was_logp.grad)


def test_dual_clip_must_exceed_one() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(x, x, None, -torch.ones(1), torch.ones(1, 2), beta=0.0, dual_clip=1.0)


def test_kl_k3_clamps_as_verls_low_var_kl() -> None:
    """verl's kl_penalty_forward("low_var_kl"): ref - logp clamped to [-20, 20], the estimate to [-10, 10]; the
    clamped tokens carry no KL gradient."""
    logp = torch.tensor([-1.0, -1.0, -1.0, -1.0, -30.0, -1.0], requires_grad=True)
    ref = torch.tensor([-1.0, -0.7, -1.6, 3.0, -1.0, -13.0])  # 0, small both ways, k3 ~ 50, delta 29, k3 ~ 11
    got = kl_k3(logp, ref)
    want = torch.tensor([kl_k3_reference(a, b) for a, b in zip(logp.tolist(), ref.tolist(), strict=True)])
    assert torch.allclose(got, want, rtol=1e-6) and got.max().item() == 10.0
    got.sum().backward()
    assert logp.grad[3:].tolist() == [0.0, 0.0, 0.0]  # all three outside the clamps
    assert logp.grad[1].item() == pytest.approx(1 - math.exp(0.3)) and logp.grad[0].item() == 0.0
