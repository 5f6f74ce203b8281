"""BM25 on a sparse (term -> documents) index built with numpy: rank-bm25's `BM25Okapi` scores, with an idf that
stays positive by default.

rank-bm25 is the reference (same tokens in, same scores out) but scores a query with a Python loop over
every document: about 0.5 s per query at 100k documents. Like bm25s, lanpo precomputes the score of every
(term, document) pair once, in a CSC layout (for each term, the documents containing it and their scores),
so a query only touches the postings of its own terms: 100x+ faster. The index build is vectorised (bm25s's is
pure-Python per document).

The idf, `idf=` (`IDFS`):
- `lucene` (the default, stage 1 of retrieval): `ln(1 + (N - n + 0.5) / (n + 0.5))`, Lucene's and
  Elasticsearch's (bm25s `method="lucene"`). It is positive for every term and falls as the document frequency
  `n` grows, so a shared word always adds to a score and a rarer one adds more. It exceeds BM25Okapi's idf by
  `ln(1 + 1/x)`, `x = (N - n + 0.5) / (n + 0.5)`, which vanishes for a rare term: on a large corpus the two rank
  alike.
- `okapi`: rank-bm25's `BM25Okapi`, `ln(N - n + 0.5) - ln(n + 0.5)`, with a term in more than half the documents
  (negative idf) given `epsilon * mean(idf over the vocabulary)` instead. Its scores are rank-bm25's to float
  rounding, so the reference tests and bench/retrieval.py use it. It cannot rank a small corpus: in a pool of one
  lesson every idf is negative (the floor too, a mean of negatives), and in a pool of two a word of one lesson
  has idf 0 and a word of both a negative one, so every score is at most 0 and stage 1 returns nothing. The floor
  also makes a term's weight hang on the rest of the vocabulary, and a term in just over half the documents can
  outweigh one in just under.
BM25+ (Lv and Zhai, 2011) would also keep scores positive, but it changes the term-frequency part (a `delta` per
matching term) where the fault is the idf alone; Lucene's idf changes nothing else of BM25Okapi (the `(k1 + 1)`
factor that Lucene drops only scales every score, so rankings are bm25s lucene's).

Repeated query tokens count once per occurrence, and unknown tokens add nothing, as in rank-bm25.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain

import numpy as np

_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """The one tokenizer of lanpo's BM25 (index and queries, lanpo and the rank-bm25 reference):
    lowercase, split on anything that is not a letter or digit."""
    return _TOKEN.findall(text.lower())


IDFS = ("lucene", "okapi")  # the idf forms of `BM25Index` (the module docstring argues the default, the first)


def lucene_idf(doc_freqs: np.ndarray, n_docs: int) -> np.ndarray:
    """Lucene's idf per term from document frequencies `(V,)`: `ln(1 + (N - n + 0.5) / (n + 0.5))`, always > 0."""
    df = np.asarray(doc_freqs, dtype=np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def okapi_idf(doc_freqs: np.ndarray, n_docs: int, epsilon: float = 0.25) -> np.ndarray:
    """BM25Okapi's idf per term from document frequencies `(V,)`, with the epsilon floor for negative values.

    `idf = log(N - n + 0.5) - log(n + 0.5)`; terms with a negative idf get `epsilon * mean(idf)`, where the
    mean is over every term before the floor (rank-bm25 `_calc_idf`).
    """
    df = np.asarray(doc_freqs, dtype=np.float64)
    idf = np.log(n_docs - df + 0.5) - np.log(df + 0.5)
    if idf.size:
        floor = epsilon * idf.mean()
        idf = np.where(idf < 0, floor, idf)
    return idf


def okapi_term_scores(
    tf: np.ndarray, doc_len: np.ndarray, avgdl: float, idf: np.ndarray, k1: float = 1.5, b: float = 0.75
) -> np.ndarray:
    """Score of one (term, document) posting: `idf * tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))`, elementwise."""
    return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avgdl))


class BM25Index:
    """An immutable BM25 index over `texts`, addressed by caller ids (e.g. problem or version ids); `idf` one of
    `IDFS` (`okapi`: rank-bm25's BM25Okapi exactly; `epsilon` is its floor and counts for nothing else)."""

    def __init__(
        self,
        texts: Sequence[str],
        ids: Sequence[int] | None = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
        idf: str = "lucene",
    ) -> None:
        if idf not in IDFS:
            raise ValueError(f"idf must be one of {', '.join(IDFS)}, got {idf!r}")
        self.ids = np.asarray(ids if ids is not None else range(len(texts)), dtype=np.int64)
        if len(self.ids) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(self.ids)} ids")
        self.k1, self.b, self.epsilon, self.idf = k1, b, epsilon, idf
        n_docs = len(texts)
        docs = [tokenize(text) for text in texts]
        doc_len = np.fromiter((len(d) for d in docs), dtype=np.int64, count=n_docs)
        self.vocab: dict[str, int] = {}
        term = np.fromiter(
            (self.vocab.setdefault(tok, len(self.vocab)) for tok in chain.from_iterable(docs)),
            dtype=np.int64,
            count=int(doc_len.sum()),
        )
        doc = np.repeat(np.arange(n_docs, dtype=np.int64), doc_len)
        # One posting per distinct (term, document), sorted by term then document: CSC order.
        postings, tf = np.unique(term * max(n_docs, 1) + doc, return_counts=True)
        posting_term, posting_doc = np.divmod(postings, max(n_docs, 1))
        doc_freqs = np.bincount(posting_term, minlength=len(self.vocab))
        if n_docs and doc_len.sum():
            weights = okapi_idf(doc_freqs, n_docs, epsilon) if idf == "okapi" else lucene_idf(doc_freqs, n_docs)
            data = okapi_term_scores(tf, doc_len[posting_doc], float(doc_len.mean()), weights[posting_term], k1, b)
        else:
            data = np.zeros(0)
        # Terms in at least half the documents (template words of summaries) are kept as dense rows: no more
        # memory than their postings, and adding a dense row is many times faster than scattering postings.
        dense = doc_freqs * 2 >= max(n_docs, 1)
        self.dense_row = np.full(len(self.vocab), -1, dtype=np.int64)
        self.dense_row[dense] = np.arange(int(dense.sum()))
        self.dense = np.zeros((int(dense.sum()), n_docs))
        in_dense = dense[posting_term]
        self.dense[self.dense_row[posting_term[in_dense]], posting_doc[in_dense]] = data[in_dense]
        sparse = ~in_dense
        index_dtype = np.int32 if n_docs < 2**31 else np.int64
        self.indices = posting_doc[sparse].astype(index_dtype)
        self.data = data[sparse]
        counts = np.bincount(posting_term[sparse], minlength=len(self.vocab))
        self.indptr = np.concatenate([[0], np.cumsum(counts)])  # sparse postings of term t: indptr[t]:indptr[t+1]

    def __len__(self) -> int:
        return len(self.ids)

    def scores(self, query: str | Sequence[str]) -> np.ndarray:
        """BM25 score of every document `(N,)` for a query (text, or tokens from `tokenize`)."""
        tokens = tokenize(query) if isinstance(query, str) else list(query)
        scores = np.zeros(len(self.ids))
        known = [self.vocab[t] for t in tokens if t in self.vocab]
        for term, count in zip(*np.unique(np.asarray(known, dtype=np.int64), return_counts=True), strict=True):
            if self.dense_row[term] >= 0:
                row = self.dense[self.dense_row[term]]
                scores += row if count == 1 else count * row
            else:
                postings = slice(self.indptr[term], self.indptr[term + 1])
                scores[self.indices[postings]] += count * self.data[postings]
        return scores

    def top_k(self, query: str | Sequence[str], k: int, exclude: Sequence[int] = ()) -> list[tuple[int, float]]:
        """The k best `(id, score)` pairs, best first (ties: lower position first), never an id in `exclude`.

        Documents that share no token with the query (score 0) are not returned.
        """
        scores = self.scores(query)
        if len(exclude):
            scores[np.isin(self.ids, np.asarray(exclude, dtype=np.int64))] = -np.inf
        return top_k_positions(scores, k, self.ids)


def top_k_positions(scores: np.ndarray, k: int, ids: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The k highest positive scores as `(ids[i], score)` (`ids` None: positions), best first, ties by position."""
    k = min(k, len(scores))
    if k <= 0:
        return []
    if k < len(scores):
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        candidates = np.flatnonzero(scores >= kth)  # all ties at the boundary, so position decides among them
    else:
        candidates = np.arange(len(scores))
    # lexsort: the last key is primary -> descending score, then ascending position
    order = candidates[np.lexsort((candidates, -scores[candidates]))][:k]
    return [(int(i if ids is None else ids[i]), float(scores[i])) for i in order if scores[i] > 0]
