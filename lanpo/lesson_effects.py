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

The lessons are solved by connected sets (lessons linked by shared uses): a set of at most `dense_limit` lessons by
a dense solve, which gives the exact marginal variances; a larger one by conjugate gradients (Jacobi
preconditioned) for the mean, with the conditional variance 1 / A_ll (its partners' effects taken as known: a
lower bound on var, so that set's intervals are too narrow where partners are uncertain).

Pure numpy: arrays in, arrays out, no session; `tests/test_lesson_effects.py` checks it against a dense loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

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
    positions = np.asarray(positions, dtype=np.float64)
    weight = 1.0 / np.asarray(gain_var, dtype=np.float64)  # (U,)
    target = np.asarray(gain, dtype=np.float64) * weight  # (U,) W d
    mean = np.zeros(n_lessons)
    var = np.full(n_lessons, prior_sd**2)
    if len(use) == 0:
        return EffectFit(mean, var, prior_sd)
    label = _connected_sets(use, lesson, n_lessons)[lesson]  # (E,) each pair's set
    order = np.argsort(label, kind="stable")
    bounds = np.flatnonzero(np.r_[True, label[order][1:] != label[order][:-1], True])
    for start, stop in itertools.pairwise(bounds):
        entries = order[start:stop]  # every pair of the set's uses
        members, local = np.unique(lesson[entries], return_inverse=True)  # the set's lessons; each pair's index
        rhs = np.bincount(local, weights=positions[entries] * target[use[entries]], minlength=len(members))
        if len(members) <= dense_limit:
            precision = _precision(use[entries], local, positions[entries], weight, len(members), prior_sd)
            mean[members] = np.linalg.solve(precision, rhs)
            var[members] = np.diag(np.linalg.inv(precision))
        else:
            mean[members], var[members] = _conjugate_gradients(
                use[entries], local, positions[entries], weight, rhs, prior_sd
            )
    return EffectFit(mean, var, prior_sd)


def _connected_sets(use: np.ndarray, lesson: np.ndarray, n_lessons: int) -> np.ndarray:
    """(n_lessons,) a label per lesson, equal for lessons linked by shared uses (union-find over the pairs)."""
    parent = np.arange(n_lessons)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[int, int] = {}
    for u, lesson_id in zip(use.tolist(), lesson.tolist(), strict=True):
        a, b = root(first.setdefault(u, lesson_id)), root(lesson_id)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return np.array([root(x) for x in range(n_lessons)], dtype=np.int64)


def _precision(
    use: np.ndarray, local: np.ndarray, positions: np.ndarray, weight: np.ndarray, n: int, prior_sd: float
) -> np.ndarray:
    """A = X' W X + I / prior_sd^2, (n, n), from the pairs: every two entries of one use add m m' w to A."""
    order = np.argsort(use, kind="stable")
    u, lesson_of, m = use[order], local[order], positions[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    counts = np.diff(np.r_[starts, len(u)])
    first, size = np.repeat(starts, counts), np.repeat(counts, counts)  # (e,) each entry's use: first entry, size
    precision = np.eye(n) / prior_sd**2
    for offset in range(int(counts.max())):  # entry e pairs with the use's entry number `offset`
        has = np.flatnonzero(offset < size)
        other = first[has] + offset
        np.add.at(precision, (lesson_of[has], lesson_of[other]), m[has] * m[other] * weight[u[has]])
    return precision


def _conjugate_gradients(
    use: np.ndarray, local: np.ndarray, positions: np.ndarray, weight: np.ndarray, rhs: np.ndarray, prior_sd: float
) -> tuple[np.ndarray, np.ndarray]:
    """A^-1 rhs by Jacobi-preconditioned conjugate gradients, A applied through the pairs; and 1 / diag(A)."""
    n, uses = len(rhs), len(weight)

    def apply(theta: np.ndarray) -> np.ndarray:
        fitted = np.bincount(use, weights=positions * theta[local], minlength=uses)  # (U,) X theta
        return np.bincount(local, weights=positions * (weight * fitted)[use], minlength=n) + theta / prior_sd**2

    diagonal = np.bincount(local, weights=positions**2 * weight[use], minlength=n) + 1.0 / prior_sd**2
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
