"""The estimated zero-shot baseline of a lesson use in training, computed by hand, at and around each of its bounds.

A training step draws a problem once, in one mode, so a use of a lesson there never has the same-step zero-shot group
its outcome needs: the store estimates the problem's zero-shot success from the run's zero-shot attempts at the 4h
steps before the use's (h: `store.baseline_half_life`), weighted 0.5 ** (age / h), the problem's own shrunk toward
all problems' with `store.baseline_prior` attempts' weight (sql/queries/usefulness_uses_recompute.sql). The loop
reference over a whole store is tests/db/test_usefulness.py; here each number is worked out in the test.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import UNCAPPED, make_experiences, make_pool, make_problems

from lanpo.config import StoreConfig
from lanpo.db import sqlfiles
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.errors import ConfigError


def _store(session: Session, name: str, half_life: float = 2.0, prior: float = 2.0, kind: str = "train") -> tuple:
    """Two problems, a lesson of the second, and a run of `kind` on a pool with these estimator settings."""
    p, q = make_problems(session, 2, dataset=name)
    (version,) = make_experiences(session, q, 1)
    pool = make_pool(session, name, replace(UNCAPPED, baseline_half_life=half_life, baseline_prior=prior))
    run = runs_repo.create_run(session, name, kind, {}, pool_id=pool.id).id
    return p, q, version, run


def _write(
    session: Session, run: int, step: int, problem: int, correct: list[bool], version: int | None = None
) -> None:
    """One group: zero-shot, or with the lesson `version` in its context."""
    attempts = [NewAttempt("r", float(c), c) for c in correct]
    contexts = [] if version is None else [ContextRef(0, experience_version_id=version)]
    mode = "zero_shot" if version is None else "inter"
    record_groups(session, [NewGroup(problem, mode, "q", attempts, step=step, run_id=run, contexts=contexts)])


def _use(session: Session, version: int) -> sa.Row:
    return session.execute(
        sa.text(
            "SELECT outcome, graded, credit, baseline, baseline_n, baseline_source, credit_var FROM lesson_uses "
            "WHERE version_id = :v ORDER BY group_id DESC LIMIT 1"
        ),
        {"v": version},
    ).one()


def _beta_var(successes: float, n: float) -> float:
    a, b = successes + 1, n - successes + 1
    return a * b / ((a + b) ** 2 * (a + b + 1))


def test_a_use_in_training_is_compared_with_the_estimate_worked_out_by_hand(session: Session) -> None:
    p, q, version, run = _store(session, "by-hand")
    _write(session, run, 1, p, [True, False])  # the problem's own: 1 of 2, one step back
    _write(session, run, 1, q, [True, True])  # another problem's: all problems' 3 of 4
    _write(session, run, 2, p, [True, True], version)  # the use: 2 of 2, no zero-shot group of p at step 2
    w = 0.5 ** (1 / 2)  # one step back at half-life 2
    mu = (3 * w) / (4 * w)  # the prior: all problems' weighted success
    b = (2 * mu + 1 * w) / (2 + 2 * w)  # kappa = 2 attempts of the prior, the problem's own 2w attempts
    use = _use(session, version)
    assert use.baseline_source == "estimated"
    assert use.baseline == pytest.approx(b, abs=1e-12) and use.baseline_n == pytest.approx(2 + 2 * w, abs=1e-12)
    assert (use.outcome, use.graded) == (1, 2) and use.credit == pytest.approx(2 - 2 * b, abs=1e-12)
    spread = _beta_var(2, 2) + _beta_var(b * (2 + 2 * w), 2 + 2 * w)
    assert use.credit_var == pytest.approx(4 * spread, abs=1e-12)  # (m * n / k)^2 = 4
    row = usefulness.of_versions(session, [version])[version]
    assert (row.helped, row.unknown, row.known) == (1, 0, 1)
    low, high = row.interval()  # type: ignore[misc]
    assert low == pytest.approx(row.lift - 1.96 * math.sqrt(use.credit_var) / 2)  # type: ignore[operator]
    assert low < row.lift < high  # type: ignore[operator]
    # neither its own step (another problem's zero-shot group there) nor a later one enters it, and such a write
    # looks at no use of another key (a step written group by group, as verl writes, costs what each group holds)
    _write(session, run, 2, q, [False, False])
    _write(session, run, 3, p, [False, False])
    assert _use(session, version) == use
    keys = {"run_ids": [run], "steps": [2], "problem_ids": [q]}
    assert session.scalars(sqlfiles.load("queries/usefulness_versions_at"), keys).all() == []
    # an exact baseline written later at the use's own key replaces the estimate
    _write(session, run, 2, p, [False, True, True, True])
    exact = _use(session, version)
    assert (exact.baseline_source, exact.baseline, exact.baseline_n, exact.outcome) == ("exact", 0.75, 4.0, 1)
    assert exact.credit == pytest.approx(2 * (1 - 0.75))


def test_the_span_ends_four_half_lives_back(session: Session) -> None:
    """Half-life 1: a zero-shot group 4 steps back counts (weight 1/16), 5 steps back does not."""
    p, _, version, run = _store(session, "span", half_life=1.0)
    _write(session, run, 1, p, [False])
    _write(session, run, 5, p, [True], version)  # at the bound: 4 steps back
    at = _use(session, version)
    assert at.baseline_source == "estimated"
    assert at.baseline == pytest.approx(0.0) and at.baseline_n == pytest.approx(2 + 1 / 16)  # mu = 0, own 0 of 1/16
    assert at.outcome == 1
    _write(session, run, 6, p, [True], version)  # above it: 5 steps back, nothing known
    above = _use(session, version)
    assert (above.baseline_source, above.baseline, above.outcome, above.graded, above.credit) == (
        None, None, None, 0, 0.0
    )  # fmt: skip
    _write(session, run, 3, p, [True], version)  # below it, 2 steps back: weight 1/4
    below = _use(session, version)  # the newest use
    assert below.baseline == pytest.approx(0.0) and below.baseline_n == pytest.approx(2 + 1 / 4)


def test_half_life_zero_keeps_exact_baselines_only(session: Session) -> None:
    p, _, version, run = _store(session, "exact-only", half_life=0.0)
    _write(session, run, 1, p, [True])
    _write(session, run, 2, p, [True], version)
    assert _use(session, version).baseline_source is None
    assert usefulness.of_versions(session, [version])[version].unknown == 1


def test_a_zero_prior_needs_the_problems_own_attempts(session: Session) -> None:
    p, q, version, run = _store(session, "no-prior", prior=0.0)
    _write(session, run, 1, q, [True, True])  # another problem's attempts alone: no estimate for p
    _write(session, run, 2, p, [False], version)
    assert _use(session, version).baseline_source is None
    _write(session, run, 3, p, [True])  # p's own attempt, one step before the next use
    _write(session, run, 4, p, [False], version)
    use = _use(session, version)
    assert (use.baseline_source, use.baseline, use.outcome) == ("estimated", pytest.approx(1.0), -1)
    assert use.baseline_n == pytest.approx(0.5**0.5)  # one attempt, one step back at half-life 2


def test_no_estimate_outside_training(session: Session) -> None:
    """An evaluation or a server answers a question both ways when it measures: only exact baselines there."""
    p, q, version, run = _store(session, "eval-run", kind="eval")
    _write(session, run, 0, q, [True, True])
    _write(session, run, 0, p, [True], version)
    assert _use(session, version).baseline_source is None


@pytest.mark.parametrize("name", ["baseline_half_life", "baseline_prior"])
@pytest.mark.parametrize("value", [-0.5, math.inf, math.nan])
def test_settings_out_of_range_are_refused(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"store\.{name} must be a finite number >= 0"):
        StoreConfig(**{name: value})
    StoreConfig(**{name: 0.0})  # the bound itself is allowed
