"""Each lesson's own effect, told apart from the lessons it was drawn with: one normal model over a pool's uses.

A use is a rollout group whose context held k lessons; it measures the group's gain over its zero-shot baseline,
d = accuracy - b, with variance v = var(accuracy) + var(b) (the Beta variances of
`sql/queries/usefulness_uses_recompute.sql`). Crediting every lesson of the context d / k (`lesson_uses.credit`)
gives each lesson the mean of its own effect and its neighbours': a lesson that does nothing, drawn beside one that
helps by 0.3, is credited 0.15 a use, as much as the helpful one earns beside it. The model here instead:

    d_u = sum over the lessons l of use u of m_ul * theta_l + e_u,     e_u ~ N(0, v_u)
    theta_l ~ N(0, prior_sd^2), independent

(m_ul: the positions l holds in u's context, almost always 1). The posterior of theta is normal, with precision
A = X' W X + I / prior_sd^2 (X: uses x lessons, of m; W = diag(1 / v)) and mean A^-1 X' W d: generalised least
squares of the gains on the lessons, shrunk by the prior (ridge regression). A lesson is told apart from a partner
by the uses the two do not share; two lessons only ever drawn together share the evidence of their sum, each half
of it with a wide interval.

`fit_effects` returns each lesson's marginal posterior N(mean, var), its partners integrated out, and
`EffectFit.evidence` divides the prior out of it: the normal likelihood N(lift, lift_var) that, under the prior,
gives that marginal (1 / lift_var = 1 / var - 1 / prior_sd^2, lift = lift_var * mean / var). That is what the
store keeps (`lesson_usefulness.net_credit = graded * lift`, `net_credit_var = graded^2 * lift_var`), so
`lanpo_lesson_value` under the same prior returns the joint posterior's mean and standard deviation exactly, and
`lesson_history.lift` is `lift`: what the uses say of the lesson alone. A lesson drawn alone gets the
inverse-variance weighted mean of its gains.

X' W X and X' W d are built once as sparse products (scipy.sparse), and the lessons are solved by connected sets
(lessons linked by shared uses, scipy's `connected_components` on X' W X): a set of at most `dense_limit` lessons by
a dense inverse, which gives the exact marginal variances; a larger one by conjugate gradients (Jacobi
preconditioned) for the mean, with the conditional variance 1 / A_ll (its partners' effects taken as known: a
lower bound on var, so that set's intervals are too narrow where partners are uncertain).

numpy and scipy: arrays in, arrays out, no session; `tests/test_lesson_effects.py` checks it against a dense loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scipy import sparse

DENSE_LIMIT = 2000  # lessons in one connected set solved densely (a 2000 x 2000 inverse: about a second)
CG_TOLERANCE = 1e-10  # relative residual at which conjugate gradients stop
CG_MAX_ITERATIONS = 1000


@dataclass(frozen=True)
class EffectFit:
    """The joint posterior's marginals, one entry per lesson: `mean` (L,), `var` (L,) (a lesson with no use: 0 and
    prior_sd^2)."""

    mean: np.ndarray
    var: np.ndarray
    prior_sd: float

    def evidence(self) -> tuple[np.ndarray, np.ndarray]:
        """(lift, lift_var), each (L,): the likelihood that the prior N(0, prior_sd^2) turns into N(mean, var). A
        lesson with no use (var = prior_sd^2): lift 0, lift_var inf."""
        precision = 1.0 / self.var - 1.0 / self.prior_sd**2  # (L,), >= 0: the posterior is never wider than the prior
        informed = precision > 1e-12 / self.prior_sd**2
        safe = np.where(informed, precision, 1.0)
        lift = np.where(informed, self.mean / self.var / safe, 0.0)
        lift_var = np.where(informed, 1.0 / safe, np.inf)
        return lift, lift_var


def fit_effects(
    use: np.ndarray,
    lesson: np.ndarray,
    positions: np.ndarray,
    gain: np.ndarray,
    gain_var: np.ndarray,
    n_lessons: int,
    prior_sd: float,
    dense_limit: int = DENSE_LIMIT,
) -> EffectFit:
    """The posterior of every lesson's effect under the module's model.

    use, lesson, positions: (E,) one entry per (use, lesson) pair: lesson `lesson[e]` (0..n_lessons-1) holds
    `positions[e]` places in the context of use `use[e]` (0..U-1), each pair once. gain, gain_var: (U,) each use's
    d and v (v > 0). Lessons in no entry keep the prior.
    """
    if prior_sd <= 0:
        raise ValueError(f"prior_sd must be > 0, got {prior_sd}")
    use, lesson = np.asarray(use, dtype=np.int64), np.asarray(lesson, dtype=np.int64)
    weight = 1.0 / np.asarray(gain_var, dtype=np.float64)  # (U,)
    mean = np.zeros(n_lessons)
    var = np.full(n_lessons, prior_sd**2)
    if len(use) == 0:
        return EffectFit(mean, var, prior_sd)
    # scipy here, not at import: every trainer, rank and worker process imports this module (through the store's
    # usefulness writer), and scipy.sparse with csgraph cost each of them 0.3-0.8 s
    from scipy import sparse
    from scipy.sparse import csgraph

    design = sparse.csr_array(  # X, (U, L) of positions
        (np.asarray(positions, dtype=np.float64), (use, lesson)), shape=(len(weight), n_lessons)
    )
    weighted = design.T.multiply(weight).tocsr()  # X' W, (L, U)
    precision = (weighted @ design).tocsr()  # X' W X, (L, L): each use adds m m' w to its lessons' pairs
    rhs = weighted @ np.asarray(gain, dtype=np.float64)  # X' W d, (L,)
    used = np.unique(lesson)
    count, label = csgraph.connected_components(precision[used][:, used], directed=False)  # the sets of used lessons
    order = np.argsort(label, kind="stable")
    bounds = np.searchsorted(label[order], np.arange(count + 1))
    for start, stop in itertools.pairwise(bounds):
        members = used[order[start:stop]]  # one set's lessons
        block = precision[members][:, members]
        if len(members) <= dense_limit:
            dense = block.toarray() + np.eye(len(members)) / prior_sd**2
            covariance = np.linalg.inv(dense)
            mean[members] = covariance @ rhs[members]
            var[members] = np.diag(covariance)
        else:
            mean[members], var[members] = _conjugate_gradients(block, rhs[members], prior_sd)
    return EffectFit(mean, var, prior_sd)


def _conjugate_gradients(block: sparse.csr_array, rhs: np.ndarray, prior_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """A^-1 rhs by Jacobi-preconditioned conjugate gradients (A = block + I / prior_sd^2, applied sparse); and
    1 / diag(A)."""

    def apply(theta: np.ndarray) -> np.ndarray:
        return block @ theta + theta / prior_sd**2

    diagonal = block.diagonal() + 1.0 / prior_sd**2
    theta = rhs / diagonal
    residual = rhs - apply(theta)
    z = residual / diagonal
    direction = z.copy()
    scale = np.linalg.norm(rhs) or 1.0
    for _ in range(CG_MAX_ITERATIONS):
        if np.linalg.norm(residual) <= CG_TOLERANCE * scale:
            break
        product = apply(direction)
        step = (residual @ z) / (direction @ product)
        theta = theta + step * direction
        new_residual = residual - step * product
        new_z = new_residual / diagonal
        direction = new_z + (new_residual @ new_z) / (residual @ z) * direction
        residual, z = new_residual, new_z
    return theta, 1.0 / diagonal
