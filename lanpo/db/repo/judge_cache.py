"""The relevance judge's scores of question texts against lesson versions (`judge_cache`, migration 0021).

A question is keyed by the sha256 of its text, a judge by its scorer (`lanpo.retrieval.judge.JudgePrompt.identity`):
the same question, lesson version and judge always get the same score, so retrieval reads these before it asks the
judge and stores what it had to ask. The serving role may read and insert them, never change one.

- `question_sha256(text)`: the key of a question.
- `cached_judge_scores(session, question_sha256, scorer, version_ids)`: the stored scores, by version id.
- `store_judge_scores(session, question_sha256, scorer, scores)`: insert scores; one already stored keeps its value
  (two servers that judged the same miss at once keep one row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles


def question_sha256(question: str) -> bytes:
    """The cache key of a question: the sha256 of its UTF-8 text (a lone surrogate is kept, not refused)."""
    return hashlib.sha256(question.encode("utf-8", "surrogatepass")).digest()


def cached_judge_scores(
    session: Session, question_sha256: bytes, scorer: str, version_ids: Sequence[int]
) -> dict[int, float]:
    """The scores `scorer` gave this question against each of `version_ids` that it has judged, by version id."""
    if not version_ids:
        return {}
    rows = session.execute(
        sqlfiles.load("queries/judge_cache_read"),
        {"question_sha256": question_sha256, "scorer": scorer, "version_ids": [int(v) for v in version_ids]},
    ).all()
    return {int(r.version_id): float(r.score) for r in rows}


def store_judge_scores(session: Session, question_sha256: bytes, scorer: str, scores: Mapping[int, float]) -> None:
    """Insert `scorer`'s scores of this question by version id; a (question, scorer, version) already stored keeps
    its score. Rows go in version order, so two writers of overlapping misses take their locks in one order."""
    if not scores:
        return
    versions = sorted(scores)
    session.execute(
        sqlfiles.load("queries/judge_cache_insert"),
        {
            "question_sha256": question_sha256,
            "scorer": scorer,
            "version_ids": [int(v) for v in versions],
            "scores": [float(scores[v]) for v in versions],
        },
    )
