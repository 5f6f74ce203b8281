"""Weighted sampling of feedback contexts for a whole batch, in one round trip (paper appendix 10.2).

Per problem the candidates are ranked (inter: relevance desc; intra: recency), the top `candidates` kept,
rank i (0-based) weighted `w_i = 1/(i+1)`, and k drawn WITHOUT replacement. The SQL (sql/queries/sample_*.sql)
uses Efraimidis-Spirakis keys `-ln(u)/w`: the k smallest keys win, in key order, which is exactly successive
weighted draws without replacement as long as the u of one pool are independent uniforms. So u comes from a
cryptographic digest: the top 52 bits of `sha256('<rank>/<problem id>/<seed>')`, plus one half, over 2^52 (exact
in float8, strictly inside (0, 1)). A cheaper integer hash was correlated for nearby numbers, which biased the
draws (issue 8). The same seed gives the same draws, whatever the order of the problem ids or the rest of the
batch. u names a candidate by its rank (the random arm: its ordinal), never its store id, so two runs whose
histories match draw alike, whatever else the store holds (keyed by ids, two arms of one seed parted at their
first intra draw). The key is one SQL function, `lanpo_draw_key(seed, candidate, problem_id, rank)` (migration
0009), that the draws call.

Inter draws rank by relevance (the paper) or, `Ranking(rank="value")`, by value: an upper confidence bound on each
candidate's lift, `lanpo_lesson_value` (migration 0020; `lesson_value` here is its Python twin), with candidates
below `value_bound` left out (docs/concepts.md, "Lessons on probation").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.errors import InputError

T = TypeVar("T")
RANKS = ("relevance", "value")  # feedback.inter.rank
PRIORS = ("zero", "pool")  # feedback.inter.prior: the value rule's prior mean, 0 or the pool's (migration 0025)
VALUE_Z = 1.96  # standard deviations above the posterior mean: the bound of lift's 95 % interval (lesson_history)
# The prior on a lesson's effect, N(0, EFFECT_PRIOR_SD^2): the pools' joint fit (usefulness.fit_pools) and eviction
# by expected lift (capacity) shrink under it. The value rule's own prior, VALUE_PRIOR_SD, sets what an untried
# lesson is worth to a draw (VALUE_Z x it: 0.196), below a lesson the fit knows helps by 0.3 however uncertain:
# bench/value.py --n 16, six seeds, the value arm earned 0.85 of the oracle's gain at 0.1 and 0.73 at 0.15 (seeds
# 0-2), where untried lessons (0.29) outbid proven ones (docs/log.md, 2026-12-06).
EFFECT_PRIOR_SD = 0.15
VALUE_PRIOR_SD = 0.1


@dataclass(frozen=True)
class Ranking:
    """How inter candidates are ranked: `relevance` (the paper: relevance, then recency) or `value` (the upper
    confidence bound on lift under a N(mu, prior_sd^2) prior, then relevance; below `value_bound`, never drawn).
    `prior`: mu is 0 (`zero`) or the pool's graded lessons' mean lift, shrunk toward 0 (`pool`: empirical Bayes,
    `lanpo_pool_prior_mean`, migration 0025)."""

    rank: str = "relevance"
    prior_sd: float = VALUE_PRIOR_SD
    value_bound: float = 0.0
    prior: str = "zero"

    def __post_init__(self) -> None:
        if self.rank not in RANKS:
            raise InputError(f"rank must be one of {', '.join(RANKS)}, got {self.rank!r}")
        if not 0.0 < self.prior_sd <= 1.0:
            raise InputError(f"prior_sd must be in (0, 1], got {self.prior_sd}")
        if not -1.0 <= self.value_bound <= 1.0:
            raise InputError(f"value_bound must be in [-1, 1], got {self.value_bound}")
        if self.prior not in PRIORS:
            raise InputError(f"prior must be one of {', '.join(PRIORS)}, got {self.prior!r}")

    def params(self) -> dict[str, Any]:
        """The SQL parameters of the draw queries' ranking."""
        return {
            "rank": self.rank,
            "prior_sd": self.prior_sd,
            "value_bound": self.value_bound,
            "z": VALUE_Z,
            "prior": self.prior,
        }


PAPER_RANKING = Ranking()  # relevance, then recency: the paper's ranking and the default


def lesson_values(session: Session, version_ids: Sequence[int], ranking: Ranking) -> dict[int, float]:
    """version id -> its value under `ranking`'s prior (`lanpo_lesson_value`, sql/queries/lesson_values.sql)."""
    if not version_ids:
        return {}
    rows = session.execute(
        sqlfiles.load("queries/lesson_values"),
        {"version_ids": [int(v) for v in version_ids], **ranking.params()},
    )
    return {int(v): float(value) for v, value in rows}


def rank_by_value(session: Session, found: Sequence[T], version_of: Callable[[T], int], ranking: Ranking) -> list[T]:
    """`found` (best first by relevance) re-ranked by `ranking`: unchanged for relevance; for value, those whose
    value is below `ranking.value_bound` dropped and the rest ordered by value, ties kept in `found`'s order."""
    if ranking.rank != "value":
        return list(found)
    values = lesson_values(session, [version_of(item) for item in found], ranking)
    kept = [(values[version_of(item)], i, item) for i, item in enumerate(found)]
    return [item for value, _, item in sorted(kept, key=lambda t: (-t[0], t[1])) if value >= ranking.value_bound]


def lesson_value(
    graded: float, credit: float, credit_var: float, prior_sd: float, z: float = VALUE_Z, prior_mean: float = 0.0
) -> float:
    """`lanpo_lesson_value` in Python (migrations 0020, 0025): the posterior mean of a version's lift under a
    N(prior_mean, prior_sd^2) prior, plus z posterior standard deviations; prior_mean + z * prior_sd with nothing
    graded."""
    if not graded:
        return prior_mean + z * prior_sd
    var = max(credit_var, 1e-9)
    precision = 1.0 / prior_sd**2 + graded * graded / var
    return (prior_mean / prior_sd**2 + credit * graded / var) / precision + z / math.sqrt(precision)


def pool_prior_mean(graded_lessons: Sequence[tuple[float, float, float]], prior_sd: float) -> float:
    """`lanpo_pool_prior_mean` in Python (migration 0025), from each graded lesson's (graded, credit, credit_var):
    the posterior mean of the pool's mean lift mu under mu ~ N(0, prior_sd^2), a lesson's measured lift
    credit / graded being N(mu, prior_sd^2 + credit_var / graded^2); 0 with none."""
    num, den = 0.0, 1.0 / prior_sd**2
    for graded, credit, credit_var in graded_lessons:
        weight = 1.0 / (prior_sd**2 + max(credit_var, 1e-9) / graded**2)
        num, den = num + weight * credit / graded, den + weight
    return num / den


@dataclass(frozen=True)
class DrawnCandidate:
    """One drawn candidate: an attempt (intra) or experience version (inter) for `problem_id`.

    `rank`: its place in the ranked pool (0 = most relevant / most recent); `position`: draw order.
    """

    problem_id: int
    candidate_id: int
    rank: int
    position: int
    text: str
    score: float | None = None
    source_problem_id: int | None = None


def rank_weights(n: int) -> np.ndarray:
    """Pure: the unnormalised weights `1/(i+1)` of ranks 0..n-1."""
    return 1.0 / np.arange(1, n + 1, dtype=np.float64)


def _check(problem_ids: Sequence[int], k: int, candidates: int, seed: int) -> list[int]:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InputError(f"k must be an integer >= 0, got {k!r}")
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise InputError(f"candidates must be an integer >= 1, got {candidates!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        raise InputError(f"seed must be a 64-bit integer, got {seed!r}")
    return sorted({int(p) for p in problem_ids})


def _group(rows: object, problem_ids: list[int], with_score: bool) -> dict[int, list[DrawnCandidate]]:
    out: dict[int, list[DrawnCandidate]] = {p: [] for p in problem_ids}
    for r in rows:  # type: ignore[attr-defined]
        out[r.problem_id].append(
            DrawnCandidate(
                r.problem_id,
                r.candidate_id,
                r.rank,
                r.position,
                r.text,
                r.score if with_score else None,
                r.source_problem_id if with_score else None,
            )
        )
    return out


def sample_intra(
    session: Session,
    problem_ids: Sequence[int],
    k: int,
    candidates: int,
    seed: int,
    run_id: int | None = None,
) -> dict[int, list[DrawnCandidate]]:
    """problem id -> up to k of its own recent attempts (of `run_id` if given; never validation attempts), drawn by
    recency weight."""
    ids = _check(problem_ids, k, candidates, seed)
    if not ids or k == 0:
        return {p: [] for p in ids}
    rows = session.execute(
        sqlfiles.load("queries/sample_intra"),
        {"problem_ids": ids, "k": k, "candidates": candidates, "seed": seed, "run_id": run_id},
    )
    return _group(rows, ids, with_score=False)


def sample_inter(
    session: Session,
    problem_ids: Sequence[int],
    k: int,
    candidates: int,
    seed: int,
    gamma: float,
    scorer: str,
    pool_id: int,
    kinds: Sequence[str] | None = None,
    shows_response: bool = False,
    ranking: Ranking = PAPER_RANKING,
) -> dict[int, list[DrawnCandidate]]:
    """problem id -> up to k current versions of active experiences of pool `pool_id` (of `kinds` only, when given:
    summary | meta), from OTHER problems with relevance >= gamma, ranked by `ranking`. `shows_response`: the text is
    the response the current version was written from, not the summary (lanpo's raw-response ablation)."""
    ids = _check(problem_ids, k, candidates, seed)
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise InputError(f"gamma must be a number in [0, 1], got {gamma!r}")
    if not isinstance(scorer, str) or not scorer.strip():
        raise InputError("scorer must name the relevance scorer (model id + prompt version) to read scores of")
    if not ids or k == 0:
        return {p: [] for p in ids}
    rows = session.execute(
        sqlfiles.load("queries/sample_inter"),
        {
            "problem_ids": ids,
            "k": k,
            "candidates": candidates,
            "seed": seed,
            "gamma": float(gamma),
            "scorer": scorer,
            "pool_id": pool_id,
            "kinds": None if kinds is None else list(kinds),
            "shows_response": bool(shows_response),
            **ranking.params(),
        },
    )
    return _group(rows, ids, with_score=True)


def sample_inter_unfiltered(
    session: Session,
    problem_ids: Sequence[int],
    k: int,
    candidates: int,
    seed: int,
    pool_id: int,
    kinds: Sequence[str] | None = None,
    shows_response: bool = False,
    ranking: Ranking = PAPER_RANKING,
) -> dict[int, list[DrawnCandidate]]:
    """problem id -> up to k current versions of active experiences of pool `pool_id` (of `kinds` only, when given)
    from OTHER problems, with no relevance filter: the whole pool is the candidate set, ranked by recency (gamma = 0:
    lanpo's reading of Table 2's w/o filtering, which only drops the threshold); `ranking` value: by value first."""
    ids = _check(problem_ids, k, candidates, seed)
    if not ids or k == 0:
        return {p: [] for p in ids}
    rows = session.execute(
        sqlfiles.load("queries/sample_inter_unfiltered"),
        {
            "problem_ids": ids,
            "k": k,
            "candidates": candidates,
            "seed": seed,
            "pool_id": pool_id,
            "kinds": None if kinds is None else list(kinds),
            "shows_response": bool(shows_response),
            **ranking.params(),
        },
    )
    return _group(rows, ids, with_score=True)
