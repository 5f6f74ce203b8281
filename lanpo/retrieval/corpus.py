"""The corpora stage 1 searches, read from the store, and an in-memory BM25 index cache kept current.

Two corpora:
- the problems of a dataset (ids = problem ids, text = question): for the problem-to-problem pre-compute;
- the current experiences of one pool (ids = experience_versions.id of the latest version of every experience
  of the pool not evicted, text = summary): for test-time retrieval.

How the BM25 index stays current: `BM25Cache` keys each index by the corpus's *state*, a few aggregates one
cheap query returns. For a pool: the largest experience-version id and the number of its active experiences.
Versions are immutable and append-only (a new experience or a rewrite raises the max id) and an experience
leaves the pool only by eviction or deletion (the active count drops), so any change to the pool changes the
key. For a dataset: count, max id and an md5 of the questions (re-imports may rewrite a question). A lookup
runs the state query; when the key differs the index is rebuilt from one scan (vectorised: seconds per 100k
summaries). `max_staleness_s` lets a busy reader skip the state query for a few seconds. During training the
pool changes every step, so the trainer reads pre-computed relevance scores instead of searching the pool;
test-time retrieval over a pool that no longer changes builds once and then only pays the state query.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from lanpo.retrieval.bm25 import BM25Index
from lanpo.retrieval.sqlfiles import query


@dataclass(frozen=True)
class Corpus:
    """Texts with their ids; `owner_ids[i]` is the problem each text belongs to (itself, for problems), `scopes[i]`
    the scope of a lesson learned by `lanpo serve` (None: shared; every problem, every lesson a trainer writes)."""

    key: tuple[object, ...]
    ids: np.ndarray
    owner_ids: np.ndarray
    texts: list[str]
    scopes: np.ndarray | None = None  # object array of str | None; None: no text has a scope


def problem_corpus_key(session: Session, dataset: str) -> tuple[object, ...]:
    row = session.execute(query("retrieval_problem_corpus_state"), {"dataset": dataset}).one()
    return ("problems", dataset, int(row.n), int(row.max_id), str(row.digest))


def pool_key(session: Session, pool_id: int) -> tuple[object, ...]:
    row = session.execute(query("retrieval_pool_state"), {"pool_id": pool_id}).one()
    return ("pool", pool_id, int(row.max_version_id), int(row.n_active))


def problem_corpus(session: Session, dataset: str) -> Corpus:
    """The questions of `dataset`, in id order."""
    key = problem_corpus_key(session, dataset)
    rows = session.execute(query("retrieval_problem_corpus"), {"dataset": dataset}).all()
    ids = np.fromiter((r.id for r in rows), dtype=np.int64, count=len(rows))
    return Corpus(key, ids, ids, [r.question for r in rows])


def pool_corpus(session: Session, pool_id: int) -> Corpus:
    """The latest summary of every active experience of pool `pool_id`, in version-id order."""
    key = pool_key(session, pool_id)
    rows = sorted(
        session.execute(query("retrieval_current_summaries"), {"pool_id": pool_id}).all(), key=lambda r: r.version_id
    )
    ids = np.fromiter((r.version_id for r in rows), dtype=np.int64, count=len(rows))
    owners = np.fromiter((r.problem_id for r in rows), dtype=np.int64, count=len(rows))
    scopes = np.array([r.scope for r in rows], dtype=object) if any(r.scope is not None for r in rows) else None
    return Corpus(key, ids, owners, [r.summary for r in rows], scopes)


@dataclass
class CachedIndex:
    corpus: Corpus
    index: BM25Index


class BM25Cache:
    """BM25 indexes keyed by corpus state (see the module docstring); the `capacity` most recent are kept.

    `max_staleness_s > 0`: within that many seconds of the last state check of a corpus, its index is reused
    without asking the database (0: check on every lookup). `idf` is the pools' indexes' (`lanpo.retrieval.bm25.IDFS`:
    `lucene`, positive on a pool of one lesson; `okapi`, rank-bm25's), `problems_idf` the datasets': rank-bm25's by
    default, as training's problem-to-problem pre-compute has always read it (its recorded draws and figures stay
    as they were; over a dataset of hundreds of questions the two rank alike but for the commonest words).
    """

    def __init__(
        self,
        capacity: int = 4,
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
        max_staleness_s: float = 0.0,
        idf: str = "lucene",
        problems_idf: str = "okapi",
    ) -> None:
        self.capacity, self.k1, self.b, self.epsilon, self.idf = capacity, k1, b, epsilon, idf
        self.problems_idf = problems_idf
        self.max_staleness_s = max_staleness_s
        self._entries: OrderedDict[tuple[object, ...], CachedIndex] = OrderedDict()
        self._checked: dict[object, tuple[float, tuple[object, ...]]] = {}
        self.builds = 0

    def _fresh_key(self, corpus_name: object, read_key: object) -> tuple[object, ...]:
        now = time.monotonic()
        seen = self._checked.get(corpus_name)
        if seen is not None and now - seen[0] < self.max_staleness_s and seen[1] in self._entries:
            return seen[1]
        key: tuple[object, ...] = read_key()  # type: ignore[operator]
        self._checked[corpus_name] = (now, key)
        return key

    def _get(self, key: tuple[object, ...], load: object, idf: str) -> CachedIndex:
        entry = self._entries.get(key)
        if entry is None:
            corpus: Corpus = load()  # type: ignore[operator]
            entry = CachedIndex(
                corpus, BM25Index(corpus.texts, corpus.ids, k1=self.k1, b=self.b, epsilon=self.epsilon, idf=idf)
            )
            self.builds += 1
            self._entries[corpus.key] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return entry

    def problems(self, session: Session, dataset: str) -> CachedIndex:
        key = self._fresh_key(("problems", dataset), lambda: problem_corpus_key(session, dataset))
        return self._get(key, lambda: problem_corpus(session, dataset), self.problems_idf)

    def pool(self, session: Session, pool_id: int) -> CachedIndex:
        key = self._fresh_key(("pool", pool_id), lambda: pool_key(session, pool_id))
        return self._get(key, lambda: pool_corpus(session, pool_id), self.idf)

    def forget(self, pool_id: int) -> None:
        """Check pool `pool_id`'s state at its next lookup, whatever `max_staleness_s` says: a writer in this process
        (`lanpo serve` learning a lesson) makes its commit show at the next request."""
        self._checked.pop(("pool", pool_id), None)


# The process-wide cache library callers (the answerer) share: pool changes show within 2 s.
DEFAULT_CACHE = BM25Cache(max_staleness_s=2.0)
