"""Retrieval and relevance: embeddings in pgvector, BM25, HNSW and hybrid first-stage search, the LLM relevance
judge with its scores cached in `relevance_scores`, the problem-to-problem pre-compute and test-time retrieval.

Modules (import what you need; nothing here imports torch):
  bm25       tokenizer + BM25 on a vectorised sparse index (Lucene's idf; rank-bm25's BM25Okapi exactly by idf=okapi)
  corpus     the two corpora read from the store (problems of a dataset, current experience summaries) and a
             BM25 index cache keyed by the pool state
  vector     pgvector HNSW cosine search (and the exact scan it is measured against)
  hybrid     reciprocal rank fusion
  search     stage 1 dispatch: bm25 | vector | hybrid
  embeddings sentence-transformers embedder, `lanpo embed`, embed-on-insert
  scorer     the yes/no LLM relevance judge (paper appendix 10.1): `judge` (a model reference) -> a loaded
             `Judge` (a `rater`) -> its identity, the `scorer` that `relevance_scores` stores
  relevance  cached scoring against `relevance_scores` and the problem-to-problem pre-compute, given a rater
  build      `lanpo relevance build`'s one way in: embed where asked, load the judge, run the pre-compute
  testtime   `retrieve(session, question, ...)` for inference
"""

STAGE1 = ("bm25", "vector", "hybrid")  # the first-stage searches, by name
EF_SEARCH_MAX = 1000  # pgvector's upper limit of hnsw.ef_search
EF_SEARCH = 100  # hnsw.ef_search of a vector search unless told otherwise
