"""Weighted sampling of feedback contexts for a whole batch, in one round trip (paper appendix 10.2).

Per problem the candidates are ranked (inter: relevance desc; intra: recency), the top `candidates` kept,
rank i (0-based) weighted `w_i = 1/(i+1)`, and k drawn WITHOUT replacement. The SQL (sql/queries/sample_*.sql)
uses Efraimidis-Spirakis keys `-ln(u)/w`: the k smallest keys win, in key order, which is exactly successive
weighted draws without replacement as long as the u of one pool are independent uniforms. So u comes from a
cryptographic digest: the top 52 bits of `sha256('<candidate id>/<problem id>/<seed>')`, plus one half, over
2^52 (exact in float8, strictly inside (0, 1)). A cheaper integer hash was correlated for nearby ids, and a
step writes a group's rollouts and a problem's lessons with consecutive ids, which biased the draws (issue 8).
The same seed gives the same draws, whatever the order of the problem ids or the rest of the batch. The key is
one SQL function, `lanpo_draw_key(seed, candidate_id, problem_id, rank)` (migration 0009), that the three call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.errors import InputError


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
) -> dict[int, list[DrawnCandidate]]:
    """problem id -> up to k current versions of active experiences of pool `pool_id` (of `kinds` only, when given:
    summary | meta), from OTHER problems with relevance >= gamma. `shows_response`: the text is the source
    rollout's response, not the summary (lanpo's raw-response ablation)."""
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
) -> dict[int, list[DrawnCandidate]]:
    """problem id -> up to k current versions of active experiences of pool `pool_id` (of `kinds` only, when given)
    from OTHER problems, with no relevance filter: the whole pool is the candidate set, ranked by recency (gamma = 0:
    lanpo's reading of Table 2's w/o filtering, which only drops the threshold)."""
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
        },
    )
    return _group(rows, ids, with_score=True)
