"""Replay advantages and losses (lanpo.rl.replay_loss) against plain per-token loops in float64, their loss and their
gradient, for each correction; without replayed rows, bit for bit `group_advantages` and `policy_loss`; the separate
row weights against RePO's J_on + J_off computed apart. Batches have B != T, so that a (B,) tensor broadcast along
the wrong axis (TRL's replay trainer degenerated silently on one) raises or gives a wrong number."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from lanpo.rl.advantages import group_advantages
from lanpo.rl.loss import policy_loss
from lanpo.rl.replay_loss import replay_advantages, replay_policy_loss, separate_term_weights

CORRECTIONS = ("none", "shaped", "separate")
AGGS = ("token-mean", "seq-mean")


# ---- references ------------------------------------------------------------------------------------------------


def advantages_reference(
    rewards: list[float], groups: list[int], replayed: list[bool], correction: str
) -> list[float]:
    """Each row's (r - mean) / (std + 1e-6) over its set, by enumeration; 0 for a set of one or of zero spread."""
    out = []
    for b, r in enumerate(rewards):
        same = [
            rewards[i]
            for i in range(len(rewards))
            if groups[i] == groups[b] and (correction != "separate" or replayed[i] == replayed[b])
        ]
        if len(same) < 2 or statistics.stdev(same) < 1e-6:
            out.append(0.0)
        else:
            out.append((r - statistics.mean(same)) / (statistics.stdev(same) + 1e-6))
    return out


def _clamp(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return torch.clamp(x, min=lo, max=hi)


def loss_reference(
    batch: dict[str, torch.Tensor],
    correction: str,
    agg: str,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.05,
    shaping: float = 0.1,
    tis_cap: float | None = None,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """The loss as written in the papers, token by token with Python branches (autograd through scalar ops gives
    the gradient): fresh rows policy_loss's term; replayed rows by correction; k3 KL on every row; row weights."""
    logp = batch["logp"]
    B, T = logp.shape
    total, count, seq_means = 0.0, 0, []
    for b in range(B):
        a = float(batch["advantages"][b])
        is_replay = bool(batch["replayed"][b])
        row_w = 1.0 if batch.get("row_weight") is None else float(batch["row_weight"][b])
        seq_total, seq_count = 0.0, 0
        for t in range(T):
            if not batch["mask"][b, t]:
                continue
            lp = logp[b, t]
            if is_replay and correction == "shaped":
                w = torch.exp(_clamp(lp - batch["replay_logp"][b, t], -20.0, 20.0))
                pg = -a * w / (w + shaping)
            else:
                old = batch["replay_logp"][b, t] if is_replay and correction == "separate" else batch["old_logp"][b, t]
                ratio = torch.exp(_clamp(lp - old, -20.0, 20.0))
                r = float(ratio.detach())
                r_clip = min(max(r, 1 - eps_low), 1 + eps_high)
                pg = -a * ratio if -a * r >= -a * r_clip else torch.tensor(-a * r_clip, dtype=lp.dtype)
                if dual_clip is not None and a < 0 and float(pg.detach()) > -a * dual_clip:
                    pg = torch.tensor(-a * dual_clip, dtype=lp.dtype)
                if tis_cap is not None and not is_replay:
                    pg = pg * min(math.exp(float(batch["old_logp"][b, t] - batch["behavior_logp"][b, t])), tis_cap)
            delta = _clamp(batch["ref_logp"][b, t] - lp, -20.0, 20.0)
            kl = _clamp(torch.exp(delta) - delta - 1, -10.0, 10.0)
            value = (pg + beta * kl) * row_w
            total, count = total + value, count + 1
            seq_total, seq_count = seq_total + value, seq_count + 1
        seq_means.append(seq_total / max(seq_count, 1))
    if agg == "token-mean":
        return total / max(count, 1)  # type: ignore[return-value]
    return sum(seq_means) / B  # type: ignore[return-value]


# ---- batches -----------------------------------------------------------------------------------------------------


def _batch(seed: int, b: int = 6, t: int = 4, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """Rows 0-2 fresh, 3-5 replayed (B = 6 != T = 4); advantages of both signs on both kinds; a masked pad on row 1
    and an empty row 4; replay_logp far from logp on replayed rows (w != 1, beyond the clip) and NaN on fresh rows,
    which no term may read."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=dtype) * 3
    replayed = torch.tensor([False, False, False, True, True, True][:b])
    replay_logp = logp + (torch.rand(b, t, generator=g, dtype=dtype) - 0.5) * 3  # w in about [0.2, 4.5]
    replay_logp[~replayed] = float("nan")
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, -1] = 0  # a pad
    mask[4] = 0  # an empty completion
    return {
        "logp": logp,
        "old_logp": logp + (torch.rand(b, t, generator=g, dtype=dtype) - 0.5) * 0.8,
        "ref_logp": logp + (torch.rand(b, t, generator=g, dtype=dtype) - 0.5),
        "advantages": torch.tensor([1.3, -0.7, -1.9, 0.9, -0.4, -1.2][:b], dtype=dtype),
        "mask": mask,
        "replayed": replayed,
        "replay_logp": replay_logp,
        "behavior_logp": logp + (torch.rand(b, t, generator=g, dtype=dtype) - 0.5) * 0.3,
    }


def _loss_and_grad(batch: dict[str, torch.Tensor], correction: str, agg: str, **kw: object):
    logp = batch["logp"].clone().requires_grad_(True)
    args = {k: v for k, v in batch.items() if k != "logp"}
    loss, stats = replay_policy_loss(logp=logp, correction=correction, agg=agg, beta=0.05, **args, **kw)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, stats


def _reference_loss_and_grad(batch: dict[str, torch.Tensor], correction: str, agg: str, **kw: object):
    logp = batch["logp"].clone().requires_grad_(True)
    loss = loss_reference({**batch, "logp": logp}, correction, agg, **kw)  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad


# ---- advantages --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_advantages_without_replays_are_group_advantages(correction: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    rewards = torch.cat([torch.rand(3 * n, generator=g), torch.tensor([1.0, 1.1] * n)])  # random, then 0/1.1 layout
    groups = torch.arange(rewards.numel()) // n
    got = replay_advantages(rewards, groups, torch.zeros(rewards.numel(), dtype=torch.bool), correction)
    assert torch.equal(got, group_advantages(rewards, n))


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_advantages_match_enumeration(correction: str) -> None:
    # groups of unequal sizes, interleaved; group 7: one fresh row and two replayed (separate: the fresh one alone
    # gets 0); group 3: replayed rows of zero spread; group 5: a single row.
    groups = [7, 3, 7, 3, 3, 7, 9, 9, 9, 3, 5, 9, 3]
    replayed = [False, False, True, False, True, True, False, False, True, True, False, True, False]
    rewards = [1.0, 0.0, 1.0, 1.1, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    got = replay_advantages(torch.tensor(rewards), torch.tensor(groups), torch.tensor(replayed), correction)
    want = advantages_reference(rewards, groups, replayed, correction)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-6)
    assert got[10] == 0.0  # a group of one
    if correction == "separate":
        assert got[0] == 0.0 and got[4] == 0.0 and got[9] == 0.0  # a part of one; a part of zero spread
    else:
        assert got[0] != 0.0  # joined, the group has spread


def test_advantages_reject_bad_inputs() -> None:
    r = torch.ones(4)
    with pytest.raises(ValueError, match="1-D"):
        replay_advantages(r, torch.zeros(4, 1, dtype=torch.long), torch.zeros(4, dtype=torch.bool), "none")
    with pytest.raises(ValueError, match="integer"):
        replay_advantages(r, torch.zeros(4), torch.zeros(4, dtype=torch.bool), "none")
    with pytest.raises(ValueError, match="correction"):
        replay_advantages(r, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.bool), "clip")


# ---- loss --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("extras", [{}, {"tis_cap": 1.5, "dual_clip": 1.25}], ids=["plain", "tis-dual"])
def test_loss_and_gradient_match_loop(agg: str, correction: str, extras: dict) -> None:
    for seed in range(3):
        batch = _batch(seed)
        batch["row_weight"] = torch.tensor([0.5, 1.0, 2.0, 1.5, 3.0, 0.25], dtype=torch.float64)
        loss, grad, _ = _loss_and_grad(batch, correction, agg, **extras)
        want_loss, want_grad = _reference_loss_and_grad(batch, correction, agg, **extras)
        assert torch.isfinite(grad).all()
        assert torch.allclose(loss, want_loss, rtol=1e-12, atol=1e-12), (seed, loss, want_loss)
        assert torch.allclose(grad, want_grad, rtol=1e-10, atol=1e-12), (seed, grad - want_grad)


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_corrections_differ_on_replayed_rows_only(correction: str) -> None:
    # the test above would pass for a loss that ignored `correction` if the references agreed: they must not
    batch = _batch(0)
    losses = {c: _loss_and_grad(batch, c, "token-mean")[1] for c in CORRECTIONS}
    for other in CORRECTIONS:
        if other != correction:
            fresh_equal = torch.equal(losses[correction][:3], losses[other][:3])
            replay_differs = not torch.allclose(losses[correction][3:], losses[other][3:])
            assert fresh_equal and replay_differs, (correction, other)


def test_shaped_rows_are_unclipped_and_shaped() -> None:
    # one replayed token, A = 1: loss -w / (w + 0.1) and gradient -A * 0.1 w / (w + 0.1)^2 at w = e^1.5, far
    # beyond the clip (a clipped term would have zero gradient there)
    logp = torch.tensor([[-0.5, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    replay_logp = torch.tensor([[-2.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0]])
    loss, stats = replay_policy_loss(
        logp, logp.detach(), None, torch.tensor([1.0], dtype=torch.float64), mask, torch.tensor([True]),
        replay_logp, "shaped", beta=0.0,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logp)
    w = math.exp(1.5)
    assert math.isclose(loss.item(), -w / (w + 0.1), rel_tol=1e-12)
    assert math.isclose(grad[0, 0].item(), -0.1 * w / (w + 0.1) ** 2, rel_tol=1e-12)
    assert math.isclose(stats["replay_ratio_mean"].item(), w, rel_tol=1e-12)
    assert math.isclose(stats["replay_shaped_mean"].item(), w / (w + 0.1), rel_tol=1e-12)
    assert stats["replay_token_frac"].item() == 1.0 and stats["clip_frac"].item() == 0.0


def test_replay_stats_match_loop() -> None:
    batch = _batch(1)
    for correction in CORRECTIONS:
        _, _, stats = _loss_and_grad(batch, correction, "token-mean", dual_clip=1.25)
        ratios, shaped, clipped, dual, all_tokens = [], [], 0, 0, 0
        for b in range(6):
            for t in range(4):
                if not batch["mask"][b, t]:
                    continue
                all_tokens += 1
                is_replay, a = bool(batch["replayed"][b]), float(batch["advantages"][b])
                old = batch["replay_logp"] if is_replay and correction != "none" else batch["old_logp"]
                w = math.exp(float(batch["logp"][b, t] - old[b, t]))
                if is_replay:
                    ratios.append(w)
                    shaped.append(w / (w + 0.1))
                if is_replay and correction == "shaped":
                    continue  # no clip, no dual clip
                clipped += (w < 0.8 and a < 0) or (w > 1.28 and a > 0)
                dual += a < 0 and -a * w > -a * 1.25
        assert math.isclose(stats["replay_ratio_mean"].item(), statistics.mean(ratios), rel_tol=1e-12)
        assert stats["replay_token_frac"].item() == len(ratios) / all_tokens
        want_shaped = statistics.mean(shaped) if correction == "shaped" else 0.0
        assert math.isclose(stats["replay_shaped_mean"].item(), want_shaped, rel_tol=1e-12)
        assert math.isclose(stats["clip_frac"].item(), clipped / all_tokens, rel_tol=1e-12), correction
        assert math.isclose(stats["dual_clip_frac"].item(), dual / all_tokens, rel_tol=1e-12), correction
        assert dual > 0


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("extras", [{}, {"tis_cap": 1.5, "dual_clip": 1.25}], ids=["plain", "tis-dual"])
def test_without_replays_it_is_policy_loss_bit_for_bit(agg: str, correction: str, extras: dict) -> None:
    batch = _batch(2, dtype=torch.float32)
    batch["replayed"] = torch.zeros(6, dtype=torch.bool)
    batch["replay_logp"] = torch.full_like(batch["logp"], float("nan"))  # never read
    loss, grad, stats = _loss_and_grad(batch, correction, agg, **extras)
    logp = batch["logp"].clone().requires_grad_(True)
    keep = ("old_logp", "ref_logp", "advantages", "mask", "behavior_logp")
    want, want_stats = policy_loss(logp, **{k: batch[k] for k in keep}, beta=0.05, agg=agg, **extras)  # type: ignore[arg-type]
    (want_grad,) = torch.autograd.grad(want, logp)
    assert torch.equal(loss, want) and torch.equal(grad, want_grad)
    for key, value in want_stats.items():
        assert torch.equal(stats[key], value), key
    assert stats["replay_token_frac"].item() == 0.0 and stats["replay_ratio_mean"].item() == 0.0


# ---- separate terms ----------------------------------------------------------------------------------------------


def _policy_loss_of(batch: dict[str, torch.Tensor], rows: torch.Tensor, old_key: str, agg: str) -> torch.Tensor:
    return policy_loss(
        batch["logp"][rows], batch[old_key][rows], batch["ref_logp"][rows], batch["advantages"][rows],
        batch["mask"][rows], beta=0.05, agg=agg,  # type: ignore[arg-type]
    )[0]  # fmt: skip


@pytest.mark.parametrize("agg", AGGS)
def test_separate_weights_give_j_on_plus_j_off(agg: str) -> None:
    batch = _batch(3)
    fresh, replayed = ~batch["replayed"], batch["replayed"]
    j_on = _policy_loss_of(batch, fresh, "old_logp", agg)
    j_off = _policy_loss_of(batch, replayed, "replay_logp", agg)
    weights = separate_term_weights(batch["replayed"], batch["mask"], agg)  # type: ignore[arg-type]
    assert weights.shape == (6,)
    loss, _, _ = _loss_and_grad({**batch, "row_weight": weights}, "separate", agg)
    assert torch.allclose(loss, j_on + j_off, rtol=1e-6, atol=1e-7)  # weights are float32
    unweighted, _, _ = _loss_and_grad(batch, "separate", agg)
    assert not torch.allclose(unweighted, j_on + j_off, rtol=1e-3)  # the weights are what make it so

    # micro-batched as lanpo.train.consumer.update does: each micro-batch's aggregate weighted by its share of the
    # minibatch's tokens (token-mean) or sequences (seq-mean), the row weights from the minibatch's totals
    per_row = batch["mask"].sum(dim=1).double() if agg == "token-mean" else torch.ones(6, dtype=torch.float64)
    totals = {"total_tokens_on": float(per_row[fresh].sum()), "total_tokens_off": float(per_row[replayed].sum())}
    summed = torch.zeros((), dtype=torch.float64)
    for rows in (torch.tensor([0, 3, 4]), torch.tensor([1, 2, 5])):
        micro = {k: v[rows] for k, v in batch.items()}
        micro["row_weight"] = separate_term_weights(micro["replayed"], micro["mask"], agg, **totals)  # type: ignore[arg-type]
        share = per_row[rows].sum() / per_row.sum()
        summed = summed + _loss_and_grad(micro, "separate", agg)[0] * share
    assert torch.allclose(summed, j_on + j_off, rtol=1e-6, atol=1e-7)


def test_separate_weights_values() -> None:
    replayed = torch.tensor([False, False, True, False, True])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0]])  # fresh 4 tokens, replayed 3
    tokens = separate_term_weights(replayed, mask, "token-mean")
    assert torch.allclose(tokens, torch.tensor([7 / 4, 7 / 4, 7 / 3, 7 / 4, 7 / 3]))
    seqs = separate_term_weights(replayed, mask, "seq-mean")
    assert torch.allclose(seqs, torch.tensor([5 / 3, 5 / 3, 5 / 2, 5 / 3, 5 / 2]))
    assert torch.equal(separate_term_weights(torch.zeros(5, dtype=torch.bool), mask, "token-mean"), torch.ones(5))
    with pytest.raises(ValueError, match="both"):
        separate_term_weights(replayed, mask, "token-mean", total_tokens_on=3.0)


# ---- shapes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "broken",
    [
        {"advantages": lambda b: b["advantages"].unsqueeze(1)},  # (B, 1): would broadcast silently to (B, T)
        {"replayed": lambda b: b["replayed"].unsqueeze(1)},  # (B, 1)
        {"row_weight": lambda b: torch.ones(b["logp"].shape[1], dtype=torch.float64)},  # (T,): a per-token weight
        {"replay_logp": lambda b: b["replay_logp"][:, :-1]},  # a replayed batch of another length T
        {"mask": lambda b: b["mask"].T},  # (T, B)
    ],
    ids=["advantages-B1", "replayed-B1", "row_weight-T", "replay_logp-T-1", "mask-TB"],
)
def test_shape_mismatches_raise(broken: dict) -> None:
    batch = _batch(0, b=6, t=4)
    ((key, make),) = broken.items()
    batch[key] = make(batch)
    with pytest.raises(ValueError, match=r"\(B"):
        _loss_and_grad(batch, "shaped", "token-mean")


@pytest.mark.parametrize("with_ref", [True, False])
def test_without_replays_and_kl_it_is_policy_loss_bit_for_bit(with_ref: bool) -> None:
    batch = _batch(4, dtype=torch.float32)
    ref = batch["ref_logp"] if with_ref else None
    logp = batch["logp"].clone().requires_grad_(True)
    none = torch.zeros(6, dtype=torch.bool)
    args = (batch["old_logp"], ref, batch["advantages"], batch["mask"])
    loss, stats = replay_policy_loss(logp, *args, none, None, "shaped", beta=0.0)
    want, want_stats = policy_loss(logp, *args, beta=0.0)
    assert torch.equal(loss, want) and torch.equal(stats["kl"], want_stats["kl"])
    assert torch.equal(torch.autograd.grad(loss, logp)[0], torch.autograd.grad(want, logp)[0])
