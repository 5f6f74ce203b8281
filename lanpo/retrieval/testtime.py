"""Test-time retrieval for a question that may not be in the store: stage 1 over the current experience
summaries of one pool -> LLM rerank -> gamma filter -> top m (ARCHITECTURE.md, "Retrieval").

Without a judge (`rater=None`) there is no rerank and no gamma filter: the top m of stage 1 come back with
`relevance=None`. An empty pool (or nothing at gamma) gives `[]`, and the caller answers zero-shot. When the
question is a stored problem (`problem_id`), its own experiences are excluded and its scores are cached in
`relevance_scores` (`lanpo infer --mode retrieval`, which stores its questions first); otherwise (`lanpo serve`,
`lanpo infer --no-store`) in `judge_cache`, by the question's text (`judged`). Either way only the pairs the cache
lacks reach the judge.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from lanpo.db.repo.judge_cache import cached_judge_scores, question_sha256, store_judge_scores
from lanpo.db.repo.sampling import PAPER_RANKING, Ranking, rank_by_value
from lanpo.errors import InputError
from lanpo.feedback_modes import GAMMA
from lanpo.retrieval import EF_SEARCH
from lanpo.retrieval.corpus import DEFAULT_CACHE, BM25Cache
from lanpo.retrieval.embeddings import Embedder, SentenceTransformerEmbedder, embed_pool
from lanpo.retrieval.judge import Judge
from lanpo.retrieval.relevance import score_pairs
from lanpo.retrieval.search import SearchParams, search_pool

log = logging.getLogger(__name__)

_EMBEDDERS: dict[str | None, Embedder] = {}


@dataclass(frozen=True)
class Retrieved:
    experience_version_id: int
    source_problem_id: int
    summary: str
    stage1_score: float
    relevance: float | None


def default_embedder(name: str | None = None) -> Embedder:
    """A process-wide embedder per model name (loading MiniLM takes seconds; do it once)."""
    if name not in _EMBEDDERS:
        _EMBEDDERS[name] = SentenceTransformerEmbedder(name)
    return _EMBEDDERS[name]


def check_question(question: str) -> None:
    """InputError for a question no search can use: not a string, blank, or holding a NUL byte."""
    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty", hint='pass the question text, e.g. lanpo retrieve "What is 2 + 3?"')
    if "\x00" in question:
        raise InputError("the question contains a NUL byte (\\x00)", hint="remove it")


def retrieve(
    session: Session,
    question: str,
    *,
    pool_id: int,
    stage1: str = "bm25",
    top_k: int = 16,
    gamma: float = GAMMA,
    m: int = 3,
    rater: Judge | None = None,
    embedder: Embedder | None = None,
    problem_id: int | None = None,
    ef_search: int = EF_SEARCH,
    cache: BM25Cache = DEFAULT_CACHE,
    embed: bool = True,
    ranking: Ranking = PAPER_RANKING,
    scope: str | None = None,
) -> list[Retrieved]:
    """At most `m` current experiences of pool `pool_id` for `question`, best first (by relevance, then stage-1
    rank). `rater` is the loaded relevance judge; None: stage 1 only. Vector and hybrid search first embed the
    pool's current lessons that have no embedding yet (`embed_pool`, in `session`'s transaction), unless `embed` is
    False (a caller whose role may not write embeddings runs `embed_pool` with another session first).
    `ranking` value (`retrieval.rank = value`): of those, the ones whose value (the upper confidence bound on their
    lift, `lanpo.db.repo.sampling.rank_by_value`) is below its bound are dropped and the rest ranked by value; with
    none left the caller answers zero-shot. `scope`: a `lanpo serve` request's scope, whose lessons it reads beside
    the shared ones (None: the shared ones only)."""
    check_question(question)
    if not 0.0 <= gamma <= 1.0:
        raise InputError(f"gamma must be in [0, 1], got {gamma}")
    if m < 1 or top_k < 1:
        raise InputError(f"m and top_k must be >= 1, got m={m}, top_k={top_k}")
    params = SearchParams(stage1=stage1, ef_search=ef_search)
    query_vector = None
    if stage1 != "bm25":
        embedder = embedder or default_embedder()
        if embed:
            embed_pool(session, pool_id, embedder)  # lessons a trainer wrote have no embedding yet
        query_vector = embedder.encode([question])[0]
    hits = search_pool(
        session,
        question,
        top_k,
        pool_id=pool_id,
        query_vector=query_vector,
        exclude_problem_ids=[problem_id] if problem_id is not None else [],
        params=params,
        cache=cache,
        scope=scope,
    )
    if rater is None:
        found = [Retrieved(h.version_id, h.problem_id, h.summary, h.score, None) for h in hits]
        return rank_by_value(session, found, _version, ranking)[:m]
    if problem_id is not None:
        summaries = {h.version_id: h.summary for h in hits}
        cached = score_pairs(
            session,
            rater,
            [(problem_id, h.version_id) for h in hits],
            lambda pair: (question, summaries[pair[1]]),
            kind="version",
        )
        relevance = [cached[(problem_id, h.version_id)] for h in hits]
    else:
        relevance = judged(session, rater, question, [(h.version_id, h.summary) for h in hits])
    ranked = sorted(
        ((r, rank, h) for rank, (h, r) in enumerate(zip(hits, relevance, strict=True)) if r >= gamma),
        key=lambda item: (-item[0], item[1]),
    )
    found = [Retrieved(h.version_id, h.problem_id, h.summary, h.score, r) for r, _, h in ranked]
    return rank_by_value(session, found, _version, ranking)[:m]


def _version(hit: Retrieved) -> int:
    return hit.experience_version_id


def judged(session: Session, rater: Judge, question: str, candidates: Sequence[tuple[int, str]]) -> list[float]:
    """The judge's score of `question` against each (version id, summary) candidate, in order: `judge_cache` first
    (by the question's text and the judge's identity); only the versions it lacks go to the judge, in one call,
    and their scores are written back. The cache is an optimisation, never a condition of the answer: a read or a
    write it cannot make (a serving role without its grants, a version deleted meanwhile) is logged and the
    request goes on (a failed read judges every candidate). Both run in savepoints of `session`'s transaction, so
    a failure leaves the rest of the retrieval's transaction usable; the scores written commit with it, when
    retrieval ends, before generation starts."""
    key = question_sha256(question)
    versions = list(dict.fromkeys(v for v, _ in candidates))
    try:
        with session.begin_nested():
            scores = cached_judge_scores(session, key, rater.identity, versions)
    except SQLAlchemyError as exc:
        log.warning("judge_cache not read, every candidate is judged: %s", _short(exc))
        scores = {}
    summaries = dict(candidates)
    missing = [v for v in versions if v not in scores]
    if missing:
        fresh = dict(zip(missing, rater.score([(question, summaries[v]) for v in missing]), strict=True))
        scores.update(fresh)
        try:
            with session.begin_nested():
                store_judge_scores(session, key, rater.identity, fresh)
        except SQLAlchemyError as exc:
            log.warning("judge_cache: %d new score(s) not stored: %s", len(fresh), _short(exc))
    return [scores[v] for v, _ in candidates]


def _short(exc: SQLAlchemyError) -> str:
    return " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
