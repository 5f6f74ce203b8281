"""Stage 1: candidate search over the store's corpora with `bm25`, `vector` (HNSW) or `hybrid` (RRF of both).

A problem is never its own candidate: problem search excludes the query problem's id, pool search excludes
every experience whose source problem is in `exclude_problem_ids`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from lanpo.errors import InputError
from lanpo.retrieval import EF_SEARCH, EF_SEARCH_MAX, STAGE1, vector
from lanpo.retrieval.bm25 import top_k_positions
from lanpo.retrieval.corpus import DEFAULT_CACHE, BM25Cache
from lanpo.retrieval.hybrid import RRF_K, rrf_fuse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchParams:
    """Stage-1 knobs shared by the problem and pool searches."""

    stage1: str = "hybrid"
    ef_search: int = EF_SEARCH
    rrf_k: int = RRF_K
    hybrid_depth: int = 50  # each ranking fused by RRF is this deep (at least k)

    def __post_init__(self) -> None:
        if self.stage1 not in STAGE1:
            raise InputError(f"stage1 must be one of {', '.join(STAGE1)}, got {self.stage1!r}")
        if isinstance(self.ef_search, bool) or not isinstance(self.ef_search, int):
            raise InputError(f"ef_search must be an integer, got {self.ef_search!r}")
        if not 1 <= self.ef_search <= EF_SEARCH_MAX:
            raise InputError(
                f"ef_search must be in 1..{EF_SEARCH_MAX} (pgvector's limit), got {self.ef_search}",
                hint="a larger top-k needs no larger ef_search: the iterative index scan returns k rows",
            )


@dataclass(frozen=True)
class PoolHit:
    """A current experience summary found by stage 1."""

    version_id: int
    problem_id: int
    summary: str
    score: float


def _needs_vector(params: SearchParams, query_vector: object) -> None:
    if params.stage1 != "bm25" and query_vector is None:
        raise InputError(
            f"stage1 {params.stage1!r} needs an embedding of the query",
            hint="run `lanpo embed --dataset NAME` first, or use --stage1 bm25",
        )


def search_problems(
    session: Session,
    dataset: str,
    problem_id: int,
    question: str,
    k: int,
    *,
    query_vector: Sequence[float] | np.ndarray | None = None,
    params: SearchParams | None = None,
    cache: BM25Cache = DEFAULT_CACHE,
) -> list[tuple[int, float]]:
    """The k problems of `dataset` most similar to problem `problem_id` (never itself): `(id, stage-1 score)`."""
    params = params or SearchParams()
    _needs_vector(params, query_vector)
    depth = k if params.stage1 != "hybrid" else max(k, params.hybrid_depth)
    lexical: list[tuple[int, float]] = []
    dense: list[tuple[int, float]] = []
    if params.stage1 in ("bm25", "hybrid"):
        lexical = cache.problems(session, dataset).index.top_k(question, depth, exclude=[problem_id])
    if params.stage1 in ("vector", "hybrid"):
        dense = vector.search_problems(
            session, query_vector, dataset, depth, exclude_ids=[problem_id], ef_search=params.ef_search
        )
    if params.stage1 == "bm25":
        return lexical
    if params.stage1 == "vector":
        return dense
    return rrf_fuse([[i for i, _ in lexical], [i for i, _ in dense]], params.rrf_k)[:k]


def search_pool(
    session: Session,
    question: str,
    k: int,
    *,
    pool_id: int,
    query_vector: Sequence[float] | np.ndarray | None = None,
    exclude_problem_ids: Sequence[int] = (),
    params: SearchParams | None = None,
    cache: BM25Cache = DEFAULT_CACHE,
    scope: str | None = None,
) -> list[PoolHit]:
    """The k current experience summaries of pool `pool_id` most similar to `question`, none from
    `exclude_problem_ids`, none of a scope but `scope` (the shared ones always; `lanpo.serve.scopes`)."""
    params = params or SearchParams()
    _needs_vector(params, query_vector)
    depth = k if params.stage1 != "hybrid" else max(k, params.hybrid_depth)
    found: dict[int, PoolHit] = {}  # version id -> hit with its stage-1 score (BM25 or cosine)
    lexical: list[int] = []
    dense: list[int] = []
    if params.stage1 in ("bm25", "hybrid"):
        cached = cache.pool(session, pool_id)
        corpus = cached.corpus
        bm25_scores = cached.index.scores(question)
        if exclude_problem_ids:
            bm25_scores[np.isin(corpus.owner_ids, list(exclude_problem_ids))] = -np.inf
        if corpus.scopes is not None:
            bm25_scores[np.array([s is not None and s != scope for s in corpus.scopes], dtype=bool)] = -np.inf
        for position, score in top_k_positions(bm25_scores, depth):
            version_id = int(corpus.ids[position])
            found[version_id] = PoolHit(version_id, int(corpus.owner_ids[position]), corpus.texts[position], score)
            lexical.append(version_id)
    if params.stage1 in ("vector", "hybrid"):
        hits = vector.search_pool(
            session,
            query_vector,
            depth,
            pool_id=pool_id,
            exclude_problem_ids=exclude_problem_ids,
            ef_search=params.ef_search,
            scope=scope,
        )
        if not hits and params.stage1 == "vector":
            log.warning("vector search found nothing: is the pool empty, or are its summaries not embedded?")
        for version_id, problem_id, similarity, summary in hits:
            found.setdefault(version_id, PoolHit(version_id, problem_id, summary, similarity))
            dense.append(version_id)
    if params.stage1 != "hybrid":
        return [found[v] for v in (lexical or dense)]
    fused = rrf_fuse([lexical, dense], params.rrf_k)[:k]
    return [PoolHit(v, found[v].problem_id, found[v].summary, score) for v, score in fused]
