"""Weighted sampling: the SQL draw against the numpy reference (chi-square), reproducibility, edge cases."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import sqlalchemy as sa
from scipy import stats
from sqlalchemy.orm import Session
from store_helpers import group, make_attempts, make_experiences, make_pool, make_problems, relevance

from lanpo.db.repo import sampling
from lanpo.db.repo.attempts import record_groups
from lanpo.errors import InputError

POOL, K, PROBLEMS, SEEDS = 8, 3, 200, 12


@pytest.fixture
def intra_pool(session: Session) -> list[int]:
    """PROBLEMS problems with POOL+2 attempts each (the two oldest fall outside the pool)."""
    pids = make_problems(session, PROBLEMS)
    record_groups(session, [group(p, [f"r{j}"], reward=0.0) for j in range(POOL + 2) for p in pids])
    return pids


def _sql_draws(session: Session, pids: list[int]) -> list[list[int]]:
    out = []
    for seed in range(SEEDS):
        for draws in sampling.sample_intra(session, pids, k=K, pool_size=POOL, seed=seed).values():
            out.append([d.rank for d in draws])
    return out


def test_rank_weights_and_reference() -> None:
    assert np.allclose(sampling.rank_weights(4), [1, 1 / 2, 1 / 3, 1 / 4])
    rng = np.random.default_rng(0)
    drawn = sampling.reference_sample(5, 3, rng)
    assert len(drawn) == len(set(drawn)) == 3 and all(0 <= r < 5 for r in drawn)
    assert sorted(sampling.reference_sample(2, 5, rng)) == [0, 1]
    assert sampling.reference_sample(0, 3, rng) == []


def test_sql_matches_reference_distribution(session: Session, intra_pool: list[int]) -> None:
    samples = _sql_draws(session, intra_pool)
    n = len(samples)
    assert n == PROBLEMS * SEEDS and all(len(s) == K == len(set(s)) for s in samples)
    assert all(0 <= r < POOL for s in samples for r in s)  # the two oldest attempts never drawn
    p = sampling.rank_weights(POOL) / sampling.rank_weights(POOL).sum()
    # first draw: exactly p
    first = np.bincount([s[0] for s in samples], minlength=POOL)
    assert stats.chisquare(first, p * n).pvalue > 1e-3
    # second draw: P(j) = sum_i p_i p_j / (1 - p_i)
    second_p = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(POOL) if i != j) for j in range(POOL)])
    second = np.bincount([s[1] for s in samples], minlength=POOL)
    assert stats.chisquare(second, second_p * n).pvalue > 1e-3
    # inclusion frequency per rank vs the numpy reference
    rng = np.random.default_rng(1)
    ref = Counter(r for _ in range(n) for r in sampling.reference_sample(POOL, K, rng))
    sql = Counter(r for s in samples for r in s)
    table = np.array([[sql[r] for r in range(POOL)], [ref[r] for r in range(POOL)]])
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # the test has power: uniform weights are rejected
    assert stats.chisquare(first, np.full(POOL, n / POOL)).pvalue < 1e-6


def test_same_seed_same_draws_other_seed_differs(session: Session, intra_pool: list[int]) -> None:
    pids = intra_pool[:20]
    a = sampling.sample_intra(session, pids, k=K, pool_size=POOL, seed=7)
    b = sampling.sample_intra(session, list(reversed(pids)), k=K, pool_size=POOL, seed=7)
    c = sampling.sample_intra(session, pids, k=K, pool_size=POOL, seed=8)
    assert a == b
    assert a != c


def test_intra_run_filter_small_pools_and_bad_args(session: Session) -> None:
    p1, p2 = make_problems(session, 2)
    make_attempts(session, p1, 2)
    run = session.scalar(sa.text("INSERT INTO runs (name, kind) VALUES ('r', 'train') RETURNING id"))
    record_groups(session, [group(p1, ["in run"], run_id=run), group(p1, ["validation"], "val", run_id=run)])
    draws = sampling.sample_intra(session, [p1, p2], k=5, pool_size=32, seed=0)
    assert len(draws[p1]) == 3 and draws[p2] == []
    only_run = sampling.sample_intra(session, [p1], k=5, pool_size=32, seed=0, run_id=run)
    assert [d.text for d in only_run[p1]] == ["in run"]
    assert sampling.sample_intra(session, [p1], k=0, pool_size=4, seed=0) == {p1: []}
    with pytest.raises(InputError, match="pool_size"):
        sampling.sample_intra(session, [p1], k=1, pool_size=0, seed=0)
    with pytest.raises(InputError, match="seed"):
        sampling.sample_intra(session, [p1], k=1, pool_size=1, seed=2**64)
    with pytest.raises(InputError, match="gamma"):
        sampling.sample_inter(session, [p1], k=1, pool_size=1, seed=0, gamma=1.5, scorer="s", pool_id=1)


def test_inter_ranks_by_relevance(session: Session) -> None:
    target, near, far, low = make_problems(session, 4)
    pool = make_pool(session)
    make_experiences(session, near, 2)
    make_experiences(session, far, 2)
    make_experiences(session, low, 2)
    make_experiences(session, near, 3, make_pool(session, "another run's pool"))  # never drawn: another pool
    relevance(session, target, near, 0.99)
    relevance(session, target, far, 0.91)
    relevance(session, target, low, 0.5)
    relevance(session, target, near, 0.1, scorer="other")
    draws = sampling.sample_inter(
        session, [target], k=10, pool_size=3, seed=3, gamma=0.9, scorer="s", pool_id=pool.id
    )[target]
    assert len(draws) == 3  # pool_size cuts the 4 relevant candidates to 3
    by_rank = sorted(draws, key=lambda d: d.rank)
    assert [d.source_problem_id for d in by_rank] == [near, near, far]
    assert [d.score for d in by_rank] == [0.99, 0.99, 0.91]
    none = sampling.sample_inter(
        session, [target], k=3, pool_size=3, seed=3, gamma=0.9, scorer="none", pool_id=pool.id
    )
    assert none == {target: []}
    wide = sampling.sample_inter(session, [target], k=9, pool_size=9, seed=3, gamma=0.9, scorer="s", pool_id=pool.id)
    assert len(wide[target]) == 4 and all("lesson" in d.text for d in wide[target])


def test_inter_sql_matches_reference_distribution(session: Session) -> None:
    """Same check for the inter query: one source problem with POOL lessons, relevant to many targets."""
    targets = make_problems(session, 150, dataset="targets")
    (source,) = make_problems(session, 1, dataset="source")
    pool = make_pool(session)
    make_experiences(session, source, POOL + 3, pool)
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            "SELECT id, :s, 's', 0.95 FROM problems WHERE dataset = 'targets'"
        ),
        {"s": source},
    )
    samples = []
    for seed in range(SEEDS):
        drawn = sampling.sample_inter(
            session, targets, k=K, pool_size=POOL, seed=seed, gamma=0.9, scorer="s", pool_id=pool.id
        )
        samples += [[d.rank for d in draws] for draws in drawn.values()]
    n = len(samples)
    assert n == len(targets) * SEEDS and all(len(s) == K == len(set(s)) for s in samples)
    p = sampling.rank_weights(POOL) / sampling.rank_weights(POOL).sum()
    first = np.bincount([s[0] for s in samples], minlength=POOL)
    assert len(first) == POOL and stats.chisquare(first, p * n).pvalue > 1e-3
    rng = np.random.default_rng(2)
    ref = Counter(r for _ in range(n) for r in sampling.reference_sample(POOL, K, rng))
    sql = Counter(r for s in samples for r in s)
    table = np.array([[sql[r] for r in range(POOL)], [ref[r] for r in range(POOL)]])
    assert stats.chi2_contingency(table).pvalue > 1e-3
