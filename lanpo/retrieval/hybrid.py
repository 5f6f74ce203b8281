"""Reciprocal rank fusion (Cormack et al. 2009): `score(d) = sum over rankings of 1 / (k + rank_d)`, rank from 1."""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60


def rrf_fuse(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Fuse best-first id lists into `(id, rrf score)`, best first; ties keep first-seen order."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking, start=1):
            scores[doc_id] = scores.get(doc_id, 0.0) + 1.0 / (k + rank)
    order = {doc_id: i for i, doc_id in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))
