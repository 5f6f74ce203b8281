"""pgvector cosine search: HNSW (approximate, `ef_search` per transaction) or an exact scan to measure it against.

Similarity is `1 - cosine distance`. Filters (dataset, excluded ids, active pool) run with pgvector's iterative
index scan (`hnsw.iterative_scan = strict_order`), so a filtered search still returns k rows in distance order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy.orm import Session

from lanpo.retrieval import EF_SEARCH, EF_SEARCH_MAX
from lanpo.retrieval.sqlfiles import query, vector_literal


def configure_search(session: Session, *, ef_search: int = EF_SEARCH, exact: bool = False) -> None:
    """Set this transaction's HNSW parameters (or turn index scans off for an exact scan)."""
    session.execute(
        query("retrieval_hnsw_settings"),
        {
            "ef_search": str(int(ef_search)),
            "iterative_scan": "strict_order",
            "enable_indexscan": "off" if exact else "on",
        },
    )


def search_problems(
    session: Session,
    query_vector: Sequence[float] | np.ndarray,
    dataset: str,
    k: int,
    *,
    exclude_ids: Sequence[int] = (),
    ef_search: int = EF_SEARCH,
    exact: bool = False,
) -> list[tuple[int, float]]:
    """The k problems of `dataset` nearest to `query_vector` as `(problem_id, similarity)`, best first."""
    configure_search(session, ef_search=min(max(ef_search, k), EF_SEARCH_MAX), exact=exact)
    rows = session.execute(
        query("retrieval_vector_problems"),
        {"query": vector_literal(query_vector), "dataset": dataset, "exclude_ids": list(exclude_ids), "k": k},
    ).all()
    return [(int(r.id), float(r.similarity)) for r in rows]


def search_pool(
    session: Session,
    query_vector: Sequence[float] | np.ndarray,
    k: int,
    *,
    pool_id: int,
    exclude_problem_ids: Sequence[int] = (),
    ef_search: int = EF_SEARCH,
    exact: bool = False,
    scope: str | None = None,
) -> list[tuple[int, int, float, str]]:
    """The k current experience summaries of pool `pool_id` nearest to `query_vector`, shared or of `scope`.

    Returns `(version_id, problem_id, similarity, summary)`, best first.
    """
    configure_search(session, ef_search=min(max(ef_search, k), EF_SEARCH_MAX), exact=exact)
    rows = session.execute(
        query("retrieval_vector_experiences"),
        {
            "query": vector_literal(query_vector),
            "pool_id": pool_id,
            "exclude_problem_ids": list(exclude_problem_ids),
            "k": k,
            "scope": scope,
        },
    ).all()
    return [(int(r.version_id), int(r.problem_id), float(r.similarity), r.summary) for r in rows]
