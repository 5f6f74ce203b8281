"""Cached relevance: a cached pair never reaches the model; `relevance build` resumes and is idempotent;
test-time retrieval filters at gamma and returns [] on an empty pool."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.repo.contexts import inter_contexts
from lanpo.retrieval.corpus import BM25Cache
from lanpo.retrieval.relevance import build_problem_relevance, score_pairs
from lanpo.retrieval.search import SearchParams
from lanpo.retrieval.testtime import retrieve
from tests.retrieval.helpers import QUESTIONS, make_experiences, make_problems, pool_id, tiny_judge


def score_rows(session: Session) -> list[tuple[int, int, str, float]]:
    return session.execute(
        sa.text("SELECT problem_id, candidate_problem_id, scorer, score FROM relevance_scores ORDER BY 1, 2")
    ).all()


def test_a_cached_pair_never_reaches_the_model(session: Session) -> None:
    ids = make_problems(session)
    rater, seen = tiny_judge(batch_size=8)
    session.execute(
        sa.text(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) VALUES (:p, :c, :s, 0.123)"
        ),
        {"p": ids[0], "c": ids[1], "s": rater.identity},
    )  # fmt: skip
    texts = dict(zip(ids, QUESTIONS, strict=True))
    asked: list[tuple[int, int]] = []

    def pair_texts(pair: tuple[int, int]) -> tuple[str, str]:
        asked.append(pair)
        return texts[pair[0]], texts[pair[1]]

    got = score_pairs(session, rater, [(ids[0], ids[1]), (ids[0], ids[2]), (ids[0], ids[2])], pair_texts)
    assert got[(ids[0], ids[1])] == 0.123
    assert asked == [(ids[0], ids[2])] and seen == [1]  # one new pair, one forward of batch 1
    seen.clear()
    again = score_pairs(session, rater, [(ids[0], ids[1]), (ids[0], ids[2])], pair_texts)
    assert again == got and seen == []  # everything cached now: the model is not called at all
    other_rater, other_seen = tiny_judge()
    other_rater.prompt_version = "relevance-other"  # another prompt version is another cache key
    score_pairs(session, other_rater, [(ids[0], ids[1])], pair_texts)
    assert other_seen == [1]


def test_relevance_build_resumes_after_an_interruption(session: Session, db: Engine) -> None:
    ids = make_problems(session)
    session.commit()
    rater, seen = tiny_judge(batch_size=4)
    cache = BM25Cache()

    def interrupt(batch: int) -> None:
        if batch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_problem_relevance(db, "toy", rater, top_k=3, cache=cache, on_batch=interrupt, progress=False)
    assert len(score_rows(session)) == 8  # two committed batches of 4
    seen.clear()
    report = build_problem_relevance(db, "toy", rater, top_k=3, cache=cache, progress=False)
    rows = score_rows(session)
    # BM25 proposes only candidates sharing a word, so fewer than 8 x 3 pairs
    assert report.pairs > 12 and report.cached == 8 and report.scored == report.pairs - 8 == sum(seen)
    assert len(rows) == len({(p, c) for p, c, _, _ in rows}) == report.pairs  # no duplicates, every pair present
    assert all(p != c and 0.0 <= s <= 1.0 and s_id == rater.identity for p, c, s_id, s in rows)
    assert {p for p, *_ in rows} == set(ids)
    seen.clear()
    rerun = build_problem_relevance(db, "toy", rater, top_k=3, cache=cache, progress=False)
    assert (rerun.cached, rerun.scored, seen) == (report.pairs, 0, [])  # idempotent
    assert score_rows(session) == rows


def test_training_reads_the_built_scores_through_inter_contexts(session: Session, db: Engine) -> None:
    ids = make_problems(session)
    make_experiences(session, [(i, f"lesson about {QUESTIONS[n]}") for n, i in enumerate(ids)])
    session.commit()
    rater, _ = tiny_judge()
    build_problem_relevance(db, "toy", rater, top_k=3, params=SearchParams("bm25"), cache=BM25Cache(), progress=False)
    P = pool_id(session)
    contexts = inter_contexts(session, ids, k=2, candidates=4, seed=0, gamma=0.0, scorer=rater.identity, pool_id=P)
    for problem_id, items in contexts.items():
        assert items and all(item.source_problem_id != problem_id for item in items)
    strict = inter_contexts(session, ids, k=2, candidates=4, seed=0, gamma=1.0, scorer=rater.identity, pool_id=P)
    assert not any(strict.values())


def test_build_refuses_unknown_dataset_and_missing_embeddings(session: Session, db: Engine) -> None:
    from lanpo.errors import InputError

    rater, _ = tiny_judge()
    with pytest.raises(InputError, match="unknown dataset 'nope'"):
        build_problem_relevance(db, "nope", rater, cache=BM25Cache(), progress=False)
    make_problems(session)
    session.commit()
    with pytest.raises(InputError, match="lanpo embed"):
        build_problem_relevance(db, "toy", rater, params=SearchParams("vector"), cache=BM25Cache(), progress=False)


def test_retrieve_empty_pool_stage1_only_gamma_and_cache(session: Session) -> None:
    ids = make_problems(session)
    rater, seen = tiny_judge()
    P = pool_id(session)
    assert retrieve(session, "How many apples?", pool_id=P, stage1="bm25", rater=rater, cache=BM25Cache()) == []
    make_experiences(
        session,
        [(ids[0], "apples: add the apples bought"), (ids[4], "apples: subtract the apples given"),
         (ids[1], "distance is speed times time"), (ids[2], "sum the numbers left to right"),
         (ids[3], "isolate x, then divide"), (ids[5], "multiply speed by hours"), (ids[6], "add the terms"),
         (ids[7], "move the constant, divide by the coefficient")],
    )  # fmt: skip
    cache = BM25Cache()
    plain = retrieve(session, "How many apples?", pool_id=P, stage1="bm25", m=5, cache=cache)
    assert {r.source_problem_id for r in plain} == {ids[0], ids[4]} and all(r.relevance is None for r in plain)
    everything = retrieve(
        session, "How many apples?", pool_id=P, stage1="bm25", gamma=0.0, m=5, rater=rater, cache=cache
    )
    assert len(everything) == 2 and all(0.0 <= r.relevance <= 1.0 for r in everything)  # type: ignore[operator]
    assert [r.relevance for r in everything] == sorted((r.relevance for r in everything), reverse=True)
    assert retrieve(session, "How many apples?", pool_id=P, stage1="bm25", gamma=1.0, rater=rater, cache=cache) == []
    # A stored problem: its own experiences are excluded and its scores are cached per experience version.
    seen.clear()
    own = retrieve(
        session, QUESTIONS[0], pool_id=P, stage1="bm25", gamma=0.0, m=1, rater=rater, problem_id=ids[0], cache=cache
    )
    assert len(own) == 1 and own[0].source_problem_id != ids[0]
    first_calls = len(seen)
    retrieve(
        session, QUESTIONS[0], pool_id=P, stage1="bm25", gamma=0.0, m=1, rater=rater, problem_id=ids[0], cache=cache
    )
    assert first_calls > 0 and len(seen) == first_calls  # second time: every pair came from relevance_scores
    cached = session.scalar(sa.text("SELECT count(*) FROM relevance_scores WHERE candidate_version_id IS NOT NULL"))
    assert cached and cached > 0


@pytest.mark.parametrize("stage1", ["vector", "hybrid"])
def test_build_with_embedding_stages(session: Session, db: Engine, stage1: str) -> None:
    from lanpo.retrieval.embeddings import embed_missing
    from tests.retrieval.helpers import HashEmbedder

    ids = make_problems(session)
    session.commit()
    embed_missing(db, HashEmbedder(), dataset="toy", what="problems", progress=False)
    rater, _ = tiny_judge(batch_size=8)
    report = build_problem_relevance(
        db, "toy", rater, top_k=2, params=SearchParams(stage1), cache=BM25Cache(), progress=False
    )
    rows = score_rows(session)
    assert report.pairs == len(rows) == 16 and all(p != c for p, c, _, _ in rows)
    assert (ids[0], ids[4]) in {(p, c) for p, c, _, _ in rows}  # the two apple questions are neighbours


@pytest.mark.parametrize("stage1", ["vector", "hybrid"])
def test_lessons_a_trainer_wrote_without_embeddings_are_found_by_vector_search(session: Session, stage1: str) -> None:
    """The trainer writes lessons with no embedding; vector search embeds the pool's current ones first, so an
    abstract lesson sharing no word with the question (BM25 finds nothing) is still a candidate."""
    from tests.retrieval.helpers import HashEmbedder

    ids = make_problems(session)
    P = pool_id(session)
    versions = make_experiences(session, [(ids[1], "keep a running total, one line per operation")])
    other = make_experiences(session, [(ids[2], "isolate the unknown first")], pool="another-pool")
    assert session.scalar(sa.text("SELECT count(*) FROM experience_versions WHERE embedding IS NULL")) == 2
    question = "How many apples?"
    assert retrieve(session, question, pool_id=P, stage1="bm25", cache=BM25Cache()) == []  # no word in common
    found = retrieve(session, question, pool_id=P, stage1=stage1, embedder=HashEmbedder(), cache=BM25Cache())
    assert [r.experience_version_id for r in found] == versions
    embedded = dict(session.execute(sa.text("SELECT id, embedding IS NOT NULL FROM experience_versions")).all())
    assert embedded == {versions[0]: True, other[0]: False}  # this pool's lessons only
