"""Relevance scores cached in `relevance_scores`, and the problem-to-problem pre-compute over a loaded judge.

The cache key is (problem, candidate, scorer), the scorer being the judge's identity `"<model id>|<prompt version>"`.
`score_pairs` looks every pair up first; only the missing ones reach the model, and they are stored with
`ON CONFLICT DO NOTHING`, so two writers racing on a pair keep one row. `build_problem_relevance` commits after
every scored batch: a killed build keeps its work and a rerun scores only what is missing (and is a no-op once
everything is scored).
Everything here takes a loaded judge, a `rater` (see `lanpo.retrieval.judge` for the three names): loading one
from a model reference is `lanpo.retrieval.build`'s, `lanpo relevance build`'s one way in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from tqdm import tqdm

from lanpo.db import stats
from lanpo.db.repo import problems
from lanpo.errors import InputError
from lanpo.retrieval.corpus import BM25Cache
from lanpo.retrieval.judge import Judge
from lanpo.retrieval.search import SearchParams, search_problems
from lanpo.retrieval.sqlfiles import query

Pair = tuple[int, int]  # (problem id, candidate id)
_KIND = {"problem": "problem", "version": "version"}


def cached_scores(session: Session, scorer: str, pairs: Sequence[Pair], kind: str = "problem") -> dict[Pair, float]:
    """The stored scores of `pairs` by `scorer`; kind `problem` (candidate problems) or `version`."""
    if not pairs:
        return {}
    rows = session.execute(
        query(f"retrieval_cached_{_KIND[kind]}_scores"),
        {"scorer": scorer, "problem_ids": [p for p, _ in pairs], "candidate_ids": [c for _, c in pairs]},
    ).all()
    return {(int(r[0]), int(r[1])): float(r[2]) for r in rows}


def store_scores(session: Session, scorer: str, scores: Mapping[Pair, float], kind: str = "problem") -> None:
    """Insert scores; pairs already stored for this scorer are left as they are."""
    if not scores:
        return
    pairs = list(scores)
    stats.note_write(session, "relevance_scores", rows=len(pairs))  # at most: pairs already stored add none
    session.execute(
        query(f"retrieval_insert_{_KIND[kind]}_scores"),
        {
            "scorer": scorer,
            "problem_ids": [p for p, _ in pairs],
            "candidate_ids": [c for _, c in pairs],
            "scores": [float(scores[pair]) for pair in pairs],
        },
    )


def score_pairs(
    session: Session,
    rater: Judge,
    pairs: Sequence[Pair],
    texts: Callable[[Pair], tuple[str, str]],
    kind: str = "problem",
) -> dict[Pair, float]:
    """Scores of `pairs`, cache first: only pairs missing from `relevance_scores` are scored (and then stored).

    `texts(pair)` gives the (problem text, candidate text) of a pair; it is only called for missing pairs.
    """
    unique = list(dict.fromkeys(pairs))
    if any(p == c for p, c in unique) and kind == "problem":
        raise InputError("a problem is never scored against itself")
    result = cached_scores(session, rater.identity, unique, kind)
    missing = [pair for pair in unique if pair not in result]
    if missing:
        fresh = dict(zip(missing, rater.score([texts(pair) for pair in missing]), strict=True))
        store_scores(session, rater.identity, fresh, kind)
        result.update(fresh)
    return result


def problem_embeddings(session: Session, dataset: str) -> dict[int, np.ndarray | None]:
    """Every problem's embedding in `dataset` (None where not embedded)."""
    rows = session.execute(query("retrieval_problem_embeddings"), {"dataset": dataset}).all()
    return {
        int(r.id): None if r.embedding is None else np.asarray(r.embedding.strip("[]").split(","), dtype=np.float32)
        for r in rows
    }


@dataclass
class BuildReport:
    problems: int = 0
    pairs: int = 0  # (problem, candidate) pairs stage 1 proposed
    cached: int = 0  # already in relevance_scores before this run
    scored: int = 0  # scored by the model in this run
    seconds: float = 0.0  # the whole build
    score_seconds: float = 0.0  # judging and storing only (stage 1 excluded)

    @property
    def pairs_per_second(self) -> float:
        return self.scored / self.score_seconds if self.score_seconds > 0 else 0.0


def build_problem_relevance(
    db: Engine,
    dataset: str,
    rater: Judge,
    *,
    top_k: int = 16,
    params: SearchParams | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    cache: BM25Cache | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> BuildReport:
    """For every problem of `dataset`: its stage-1 top-k other problems, scored by `rater`, stored under its
    scorer (`rater.identity`).

    One transaction per batch of `batch_size` pairs (default: the judge's batch size). `on_batch(n)` is called
    after batch n is committed (tests use it to interrupt a build).
    """
    if top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {top_k}")
    params = params or SearchParams(stage1="bm25")
    cache = cache or BM25Cache()  # one build reads one snapshot; no staleness window here
    batch = batch_size or rater.batch_size
    started = time.perf_counter()
    report = BuildReport()
    with Session(db) as session:
        corpus = cache.problems(session, dataset).corpus
        if len(corpus.ids) == 0:
            problems.require_dataset(session, dataset)  # names the datasets there are
            raise InputError(f"dataset {dataset!r} has no problems", hint="import some with `lanpo data import`")
        texts = {int(i): t for i, t in zip(corpus.ids, corpus.texts, strict=True)}
        vectors = problem_embeddings(session, dataset) if params.stage1 != "bm25" else {}
        if params.stage1 != "bm25" and any(v is None for v in vectors.values()):
            missing = sum(v is None for v in vectors.values())
            raise InputError(
                f"{missing} problems of {dataset!r} have no embedding; stage1 {params.stage1!r} needs them",
                hint=f"run `lanpo embed --dataset {dataset} --what problems`, or use --stage1 bm25",
            )
        pairs: list[Pair] = []
        for problem_id in texts:
            hits = search_problems(
                session,
                dataset,
                problem_id,
                texts[problem_id],
                top_k,
                query_vector=vectors.get(problem_id),
                params=params,
                cache=cache,
            )
            pairs.extend((problem_id, candidate) for candidate, _ in hits)
            session.rollback()  # end the read transaction (SET LOCAL search settings die with it)
        report.problems, report.pairs = len(texts), len(pairs)
        known: set[Pair] = set()
        for start in range(0, len(pairs), 5000):
            known.update(cached_scores(session, rater.identity, pairs[start : start + 5000]))
    report.cached = len(known)
    todo = [pair for pair in pairs if pair not in known]
    bar = tqdm(total=len(todo), desc=f"relevance {dataset}", unit="pair", disable=not progress or not todo)
    scoring_started = time.perf_counter()
    for number, start in enumerate(range(0, len(todo), batch), start=1):
        chunk = todo[start : start + batch]
        scores = rater.score([(texts[p], texts[c]) for p, c in chunk])
        with Session(db) as session, session.begin():
            store_scores(session, rater.identity, dict(zip(chunk, scores, strict=True)))
        report.scored += len(chunk)
        bar.update(len(chunk))
        if on_batch is not None:
            on_batch(number)
    bar.close()
    report.score_seconds = time.perf_counter() - scoring_started
    report.seconds = time.perf_counter() - started
    return report


def relevance_status(session: Session, dataset: str, gamma: float) -> list[dict[str, object]]:
    """Per scorer: scored problem pairs of `dataset`, how many reach `gamma`, mean score, problems covered.

    An unknown dataset is an InputError listing the datasets (an empty list means: known, not scored yet).
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise InputError(f"gamma must be a number in [0, 1], got {gamma!r}")
    rows = session.execute(query("retrieval_relevance_status"), {"dataset": dataset, "gamma": gamma}).all()
    if not rows:
        problems.require_dataset(session, dataset)
    return [dict(r._mapping) for r in rows]
