"""The lesson a new one repeats: the nearest active lesson of its problem that passes the merge's two checks
(cosine at or above the pool's `merge_threshold`, and `lanpo.merging.same_terms`). `lanpo.db.repo.experiences`
admits a new lesson through it when the pool merges; call it holding the problem's writer lock
(`capacity.lock_problems`), so that two writers of one paraphrase queue and the second sees the first's version.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo.pools import PoolRow
from lanpo.merging import same_terms

NEAREST = 4  # candidates read per new lesson: the nearest that fails the guard must not hide the next one


@dataclass(frozen=True)
class Near:
    """An active lesson a new one repeats: its id, its current version (id, text, reward) and their cosine."""

    experience_id: int
    version_id: int
    summary: str
    reward: float | None
    similarity: float


def nearest(session: Session, pool: PoolRow, problem_id: int, kind: str, summary: str, embedding: str) -> Near | None:
    """The closest active lesson of `problem_id` (kind `kind`) in `pool` that `summary` (embedded as `embedding`,
    pgvector text) repeats, or None: no candidate reaches the threshold and passes the guard."""
    if pool.merge_threshold is None:
        return None
    rows = session.execute(
        sqlfiles.load("queries/lesson_nearest"),
        {"pool_id": pool.id, "problem_id": problem_id, "kind": kind, "embedding": embedding, "limit": NEAREST},
    )
    for row in rows:
        if row.similarity < pool.merge_threshold:
            return None  # closest first: none further on reaches it either
        if same_terms(summary, row.summary):
            return Near(row.experience_id, row.version_id, row.summary, row.reward, float(row.similarity))
    return None
