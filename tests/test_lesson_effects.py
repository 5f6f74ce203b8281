"""`lanpo.lesson_effects`: the joint fit of lessons' effects against a dense loop over the model's matrices, its
large-set path against the dense one, its evidence against `lanpo_lesson_value`'s Python twin, and what it tells
apart that an equal share per item cannot."""

from __future__ import annotations

import numpy as np
import pytest

from lanpo.db.repo.sampling import lesson_value
from lanpo.lesson_effects import fit_effects

PRIOR_SD = 0.15


def _reference(uses: list[dict[int, int]], gain: np.ndarray, gain_var: np.ndarray, n: int) -> tuple:
    """The posterior by the book: X (uses x lessons, of positions), A = X' W X + I / prior_sd^2, mean A^-1 X' W d,
    covariance A^-1; filled one entry at a time."""
    design = np.zeros((len(uses), n))
    for u, context in enumerate(uses):
        for lesson, positions in context.items():
            design[u, lesson] = positions
    precision = np.eye(n) / PRIOR_SD**2
    rhs = np.zeros(n)
    for u in range(len(uses)):
        for i in range(n):
            rhs[i] += design[u, i] * gain[u] / gain_var[u]
            for j in range(n):
                precision[i, j] += design[u, i] * design[u, j] / gain_var[u]
    covariance = np.linalg.inv(precision)
    return covariance @ rhs, np.diag(covariance)


def _random_uses(seed: int, n: int = 24, count: int = 60) -> tuple:
    """Contexts of 1-3 lessons among the first n - 4 (the last 4 never used, two sets of lessons), a lesson now and
    then at two positions; gains and their variances at random."""
    rng = np.random.default_rng(seed)
    uses = []
    for _ in range(count):
        half = rng.integers(2)  # lessons 0..9 and 10..n-5: two sets that never share a use
        pool = np.arange(10) if half == 0 else np.arange(10, n - 4)
        picked = rng.choice(pool, size=int(rng.integers(1, 4)), replace=False)
        uses.append({int(lesson): 1 + int(rng.random() < 0.1) for lesson in picked})
    gain = rng.normal(0.0, 0.3, size=count)
    gain_var = rng.uniform(0.01, 0.2, size=count)
    return uses, gain, gain_var


def _entries(uses: list[dict[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pairs = [(u, lesson, m) for u, context in enumerate(uses) for lesson, m in context.items()]
    use, lesson, positions = (np.array(column) for column in zip(*pairs, strict=True))
    return use, lesson, positions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_is_the_posterior_by_the_book(seed: int) -> None:
    uses, gain, gain_var = _random_uses(seed)
    mean, var = _reference(uses, gain, gain_var, 24)
    fit = fit_effects(*_entries(uses), gain, gain_var, 24, PRIOR_SD)
    np.testing.assert_allclose(fit.mean, mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fit.var, var, rtol=1e-10, atol=0)
    assert (fit.mean[-4:] == 0).all() and (fit.var[-4:] == PRIOR_SD**2).all()  # never used: the prior


def test_a_large_set_by_conjugate_gradients() -> None:
    """Over `dense_limit` lessons in one set: the same mean, and 1 / A_ll for the variance, never above the
    marginal's (the partners taken as known)."""
    uses, gain, gain_var = _random_uses(5)
    dense = fit_effects(*_entries(uses), gain, gain_var, 24, PRIOR_SD)
    sparse = fit_effects(*_entries(uses), gain, gain_var, 24, PRIOR_SD, dense_limit=3)
    np.testing.assert_allclose(sparse.mean, dense.mean, rtol=0, atol=1e-9)
    assert (sparse.var <= dense.var + 1e-15).all() and (sparse.var[:-4] < dense.var[:-4]).any()


def test_the_evidence_gives_back_the_posterior_under_lanpo_lesson_value() -> None:
    """net_credit = graded * lift and net_credit_var = graded^2 * lift_var, valued by lanpo_lesson_value at the
    fit's prior: the fit's mean at z = 0, its mean plus 1.96 sd at the draws' z."""
    uses, gain, gain_var = _random_uses(7)
    fit = fit_effects(*_entries(uses), gain, gain_var, 24, PRIOR_SD)
    lift, lift_var = fit.evidence()
    graded = 4.0 * np.arange(1, 25)  # any positive count: the value depends on credit / graded and its variance
    for i in range(20):
        credit, credit_var = graded[i] * lift[i], graded[i] ** 2 * lift_var[i]
        assert lesson_value(graded[i], credit, credit_var, PRIOR_SD, 0.0) == pytest.approx(fit.mean[i], abs=1e-12)
        bound = fit.mean[i] + 1.96 * np.sqrt(fit.var[i])
        assert lesson_value(graded[i], credit, credit_var, PRIOR_SD) == pytest.approx(bound, abs=1e-12)
    assert (lift[-4:] == 0).all() and np.isinf(lift_var[-4:]).all()


def test_a_lesson_alone_gets_its_gains_inverse_variance_mean() -> None:
    gain, gain_var = np.array([0.5, -0.25, 0.0]), np.array([0.1, 0.05, 0.2])
    fit = fit_effects(np.arange(3), np.zeros(3, dtype=int), np.ones(3), gain, gain_var, 1, PRIOR_SD)
    lift, lift_var = fit.evidence()
    assert lift[0] == pytest.approx(np.sum(gain / gain_var) / np.sum(1 / gain_var), abs=1e-12)
    assert lift_var[0] == pytest.approx(1 / np.sum(1 / gain_var), rel=1e-10)


def test_a_lesson_that_does_nothing_drawn_beside_one_that_helps() -> None:
    """A helps by 0.3 and is drawn alone and beside B; B does nothing and is only ever drawn beside A (four uses
    each way). The share per item credits B 0.15 a use, half of A's gain, and A 0.225; the fit credits B what A's
    shrunk estimate leaves of the pair's gain (A's own uses make it near 0.3), B's interval spanning 0 and A's above
    it."""
    alone, together = [{0: 1}] * 4, [{0: 1, 1: 1}] * 4
    uses = alone + together
    gain, gain_var = np.full(8, 0.3), np.full(8, 0.02)  # every use gains 0.3, whether B is there or not
    shares = {lesson: np.mean([gain[u] / len(c) for u, c in enumerate(uses) if lesson in c]) for lesson in (0, 1)}
    assert shares == pytest.approx({0: 0.225, 1: 0.15})  # the old estimator: B looks two thirds as good as A
    lift, lift_var = fit_effects(*_entries(uses), gain, gain_var, 2, PRIOR_SD).evidence()
    assert abs(lift[1]) < shares[1] / 2 and lift[0] > shares[0]
    assert lift[1] - 1.96 * lift_var[1] ** 0.5 < 0 < lift[1] + 1.96 * lift_var[1] ** 0.5
    assert lift[0] - 1.96 * lift_var[0] ** 0.5 > 0


def test_two_lessons_only_drawn_together_share_their_sum() -> None:
    """Nothing tells them apart: each gets the pair's gain as its evidence, with the prior's width (the joint
    posterior splits the sum evenly, each effect as uncertain as the difference is)."""
    uses = [{0: 1, 1: 1}] * 20
    fit = fit_effects(*_entries(uses), np.full(20, 0.4), np.full(20, 0.01), 2, PRIOR_SD)
    assert fit.mean[0] == pytest.approx(fit.mean[1]) and fit.mean.sum() == pytest.approx(0.4, abs=0.01)
    lift, lift_var = fit.evidence()
    assert lift == pytest.approx([0.4, 0.4], abs=0.01) and lift_var == pytest.approx([PRIOR_SD**2] * 2, rel=0.05)
