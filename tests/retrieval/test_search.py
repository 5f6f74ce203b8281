"""Stage 1 against the real store: HNSW vs exact scan, self-exclusion, the pool corpus and its BM25 cache."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.retrieval import vector
from lanpo.retrieval.corpus import BM25Cache, pool_corpus
from lanpo.retrieval.embeddings import embed_missing
from lanpo.retrieval.hybrid import rrf_fuse
from lanpo.retrieval.search import SearchParams, search_pool, search_problems
from lanpo.retrieval.sqlfiles import vector_literal
from tests.retrieval.helpers import HashEmbedder, make_experiences, make_problems, pool_id


def test_rrf_fuse_by_hand() -> None:
    fused = rrf_fuse([[1, 2, 3], [3, 1]], k=60)
    expected = {1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61}
    assert [i for i, _ in fused] == [1, 3, 2]
    for doc_id, score in fused:
        assert score == pytest.approx(expected[doc_id])
    assert rrf_fuse([[], []]) == []


def random_problems(session: Session, n: int, dim: int = 384, seed: int = 0) -> tuple[list[int], np.ndarray]:
    ids = make_problems(session, "vec", [f"problem number {i}" for i in range(n)])
    vectors = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    session.execute(
        sa.text("UPDATE problems SET embedding = CAST(:e AS vector) WHERE id = :id"),
        [{"id": i, "e": vector_literal(v)} for i, v in zip(ids, vectors, strict=True)],
    )
    session.commit()
    return ids, vectors


def test_hnsw_with_high_ef_search_equals_exact_scan_and_numpy(session: Session) -> None:
    ids, vectors = random_problems(session, 300)
    rng = np.random.default_rng(1)
    for _ in range(10):
        q = rng.normal(size=384).astype(np.float32)
        q /= np.linalg.norm(q)
        hnsw = vector.search_problems(session, q, "vec", 10, ef_search=400)
        session.rollback()
        exact = vector.search_problems(session, q, "vec", 10, exact=True)
        session.rollback()
        numpy_top = [ids[i] for i in np.argsort(-(vectors @ q))[:10]]
        assert [i for i, _ in exact] == numpy_top
        assert [i for i, _ in hnsw] == numpy_top
        np.testing.assert_allclose([s for _, s in hnsw], np.sort(vectors @ q)[::-1][:10], atol=1e-5)


def test_hnsw_is_used_and_exact_flag_disables_it(session: Session) -> None:
    random_problems(session, 50)
    session.execute(sa.text("ANALYZE problems"))
    plan = "SELECT id FROM problems WHERE dataset = 'vec' ORDER BY embedding <=> CAST(:q AS vector) LIMIT 5"
    q = vector_literal(np.ones(384) / np.sqrt(384))
    vector.configure_search(session, ef_search=40)
    # A 50-row table is cheaper to sort than to search: make the planner show that it *can* use HNSW.
    session.execute(sa.text("SET LOCAL enable_sort = off"))
    text = "\n".join(r[0] for r in session.execute(sa.text("EXPLAIN " + plan), {"q": q}))
    assert "ix_problems_embedding_hnsw" in text
    session.rollback()
    vector.configure_search(session, exact=True)
    text = "\n".join(r[0] for r in session.execute(sa.text("EXPLAIN " + plan), {"q": q}))
    assert "ix_problems_embedding_hnsw" not in text
    session.rollback()


@pytest.mark.parametrize("stage1", ["bm25", "vector", "hybrid"])
def test_problem_search_never_returns_the_problem_itself(session: Session, db: object, stage1: str) -> None:
    ids = make_problems(session)
    session.commit()
    embedder = HashEmbedder()
    embed_missing(db, embedder, dataset="toy", what="problems", progress=False)  # type: ignore[arg-type]
    questions = dict(session.execute(sa.text("SELECT id, question FROM problems")).all())
    cache = BM25Cache()
    for problem_id in ids:
        hits = search_problems(
            session, "toy", problem_id, questions[problem_id], 5,
            query_vector=embedder.encode([questions[problem_id]])[0], params=SearchParams(stage1=stage1), cache=cache,
        )  # fmt: skip
        session.rollback()
        assert hits and problem_id not in [i for i, _ in hits]
        assert len({i for i, _ in hits}) == len(hits)
    # the apples questions find each other first
    apples = search_problems(session, "toy", ids[0], questions[ids[0]], 1, params=SearchParams("bm25"), cache=cache)
    assert apples[0][0] == ids[4]


def test_vector_stage_without_embedding_is_a_clear_error(session: Session) -> None:
    from lanpo.errors import InputError

    ids = make_problems(session)
    with pytest.raises(InputError, match="embedding"):
        search_problems(session, "toy", ids[0], "q", 3, params=SearchParams(stage1="vector"))


def test_pool_corpus_holds_latest_versions_of_active_experiences_only(session: Session) -> None:
    ids = make_problems(session)
    v1, v2, v3 = make_experiences(session, [(ids[0], "first"), (ids[1], "second"), (ids[2], "third")])
    experience_of_v2 = session.scalar(
        sa.text("SELECT experience_id FROM experience_versions WHERE id = :v"), {"v": v2}
    )
    session.execute(
        sa.text(
            "INSERT INTO experience_versions (experience_id, version, summary) VALUES (:e, 2, 'second, rewritten')"
        ),
        {"e": experience_of_v2},
    )
    session.execute(
        sa.text("UPDATE experiences SET evicted_at = now(), evicted_by = 'test' WHERE id = "
                "(SELECT experience_id FROM experience_versions WHERE id = :v)"),
        {"v": v3},
    )  # fmt: skip
    make_experiences(session, [(ids[3], "another run's lesson")], pool="elsewhere")
    corpus = pool_corpus(session, pool_id(session))
    assert corpus.texts == ["first", "second, rewritten"]
    assert list(corpus.owner_ids) == [ids[0], ids[1]]
    assert v1 in corpus.ids and v2 not in corpus.ids


def test_pool_search_excludes_own_problem_and_cache_follows_the_pool(session: Session) -> None:
    ids = make_problems(session)
    make_experiences(
        session,
        [(ids[0], "count apples: add the apples bought"), (ids[4], "apples left: subtract the apples given away"),
         (ids[1], "distance is speed times time")],
    )  # fmt: skip
    elsewhere = [(ids[5], "apples in another run's pool"), (ids[6], "sum the terms"), (ids[7], "isolate y")]
    make_experiences(session, elsewhere, pool="elsewhere")  # BM25 idf needs a few documents to say anything
    session.commit()
    cache = BM25Cache()
    params = SearchParams(stage1="bm25")
    P = pool_id(session)
    hits = search_pool(session, "How many apples?", 5, pool_id=P, params=params, cache=cache)
    assert {h.problem_id for h in hits} == {ids[0], ids[4]}  # never the other pool's
    hits = search_pool(
        session, "How many apples?", 5, pool_id=P, exclude_problem_ids=[ids[0]], params=params, cache=cache
    )
    assert [h.problem_id for h in hits] == [ids[4]]
    assert cache.builds == 1  # unchanged pool: the index is reused
    other = search_pool(
        session, "How many apples?", 5, pool_id=pool_id(session, "elsewhere"), params=params, cache=cache
    )
    assert [h.problem_id for h in other] == [ids[5]] and cache.builds == 2  # an index per pool
    make_experiences(session, [(ids[2], "more apples: sum the apples in every basket")])
    session.commit()
    hits = search_pool(session, "apples", 5, pool_id=P, exclude_problem_ids=[ids[0]], params=params, cache=cache)
    assert cache.builds == 3 and ids[2] in {h.problem_id for h in hits}


@pytest.mark.parametrize("stage1", ["vector", "hybrid"])
def test_pool_vector_and_hybrid_search(session: Session, db: object, stage1: str) -> None:
    ids = make_problems(session)
    make_experiences(
        session,
        [(ids[0], "apples: add the apples"), (ids[4], "apples: subtract the apples"), (ids[1], "speed times time")],
    )
    make_experiences(session, [(ids[5], "apples: how many apples, another pool")], pool="elsewhere")
    session.commit()
    embedder = HashEmbedder()
    embed_missing(db, embedder, dataset=None, what="experiences", progress=False)  # type: ignore[arg-type]
    q = "how many apples"
    hits = search_pool(
        session, q, 2, pool_id=pool_id(session), query_vector=embedder.encode([q])[0], exclude_problem_ids=[ids[4]],
        params=SearchParams(stage1=stage1), cache=BM25Cache(),
    )  # fmt: skip
    assert hits[0].problem_id == ids[0]
    assert not {ids[4], ids[5]} & {h.problem_id for h in hits}


def test_pool_key_follows_evictions_and_staleness_window_skips_checks(session: Session) -> None:
    ids = make_problems(session)
    versions = make_experiences(
        session, [(ids[n], f"lesson {n} about apples" if n < 2 else f"lesson {n}") for n in range(8)]
    )
    session.commit()
    cache = BM25Cache()
    relaxed = BM25Cache(max_staleness_s=3600)
    params = SearchParams(stage1="bm25")
    P = pool_id(session)
    assert len(search_pool(session, "apples", 5, pool_id=P, params=params, cache=cache)) == 2
    search_pool(session, "apples", 5, pool_id=P, params=params, cache=relaxed)
    session.execute(
        sa.text(
            "UPDATE experiences SET evicted_at = now(), evicted_by = 'test' "
            "WHERE id = (SELECT experience_id FROM experience_versions WHERE id = :v)"
        ),
        {"v": versions[0]},
    )
    session.commit()
    hits = search_pool(session, "apples", 5, pool_id=P, params=params, cache=cache)
    assert [h.version_id for h in hits] == [versions[1]] and cache.builds == 2  # the eviction changed the key
    assert len(search_pool(session, "apples", 5, pool_id=P, params=params, cache=relaxed)) == 2
    assert relaxed.builds == 1


def test_the_default_stage_1_finds_the_one_lesson_of_a_demo_like_pool(session: Session) -> None:
    """After `lanpo demo` the pool may hold one lesson: BM25Okapi's idf is negative for every word of a corpus of
    one, so stage 1 found nothing and retrieval answered zero-shot; the default (Lucene's idf) finds it."""
    from lanpo.inference.config import RetrievalSettings
    from lanpo.retrieval.corpus import DEFAULT_CACHE
    from lanpo.retrieval.testtime import retrieve

    ask = "State the final answer to the following arithmetic problem: {} ="
    trained, held_out = make_problems(session, "chain_sum", [ask.format("1 + 5"), ask.format("4 - 1")])
    lesson = (
        "## Flow\nRead the two numbers and the sign of the arithmetic problem, then compute.\n"
        "## Principles\nAdd for +, subtract for -.\n## Pitfalls\nDo not state the answer before computing it."
    )
    (version,) = make_experiences(session, [(trained, lesson)])
    session.commit()
    question = "State the final answer to the following arithmetic problem: 4 - 1 ="
    settings = RetrievalSettings()
    assert settings.stage1 == "bm25" and DEFAULT_CACHE.idf == "lucene"  # what serve and infer read by default
    found = retrieve(
        session, question, pool_id=pool_id(session), stage1=settings.stage1, rater=None, problem_id=held_out,
        cache=BM25Cache(),
    )  # fmt: skip
    assert [(h.experience_version_id, h.stage1_score > 0) for h in found] == [(version, True)]
    okapi = retrieve(session, question, pool_id=pool_id(session), rater=None, cache=BM25Cache(idf="okapi"))
    assert okapi == []  # the rank-bm25 form, kept for the reference bench, finds nothing here


@pytest.mark.parametrize("stage1", ["bm25", "vector", "hybrid"])
def test_a_scope_reads_its_own_lessons_and_the_shared_never_another_scopes(
    session: Session, db: object, stage1: str
) -> None:
    """Lessons `lanpo serve` learned in a scope (migration 0022): a search in scope alice finds the shared lessons and
    alice's, never bob's; a search in no scope (lanpo infer, retrieval in training) the shared ones only."""
    ids = make_problems(session)
    versions = make_experiences(
        session,
        [(ids[0], "apples: add the apples"), (ids[1], "apples: count alice's apples"),
         (ids[2], "apples: count bob's apples"), (ids[3], "speed times time")],
    )  # fmt: skip
    scope_of = {versions[1]: "alice", versions[2]: "bob"}
    session.execute(
        sa.text(
            "UPDATE experiences SET scope = :s "
            "WHERE id = (SELECT experience_id FROM experience_versions WHERE id = :v)"
        ),
        [{"v": v, "s": s} for v, s in scope_of.items()],
    )
    session.commit()
    embedder = HashEmbedder()
    embed_missing(db, embedder, dataset=None, what="experiences", progress=False)  # type: ignore[arg-type]
    q = "how many apples"
    vector_q = None if stage1 == "bm25" else embedder.encode([q])[0]
    found = {}
    for scope in ("alice", "bob", None):
        hits = search_pool(
            session, q, 4, pool_id=pool_id(session), query_vector=vector_q, params=SearchParams(stage1=stage1),
            cache=BM25Cache(), scope=scope,
        )  # fmt: skip
        found[scope] = {h.version_id for h in hits}
    assert versions[1] in found["alice"] and versions[2] not in found["alice"] and versions[0] in found["alice"]
    assert versions[2] in found["bob"] and versions[1] not in found["bob"]
    assert not {versions[1], versions[2]} & found[None] and versions[0] in found[None]
