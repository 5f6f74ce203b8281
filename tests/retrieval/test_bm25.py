"""BM25: lanpo's index with idf=okapi against the rank-bm25 BM25Okapi reference (scores and top-k), with the default
Lucene idf against bm25s's lucene method and on pools of one and two lessons, and its edge cases."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from lanpo.retrieval.bm25 import BM25Index, lucene_idf, okapi_idf, tokenize, top_k_positions

WORDS = ["apple", "train", "sum", "x", "solve", "the", "a", "of", "km", "hour", "7", "12", "mod", "prime"]


def random_corpus(seed: int, n_docs: int, vocab: list[str]) -> list[str]:
    rng = random.Random(seed)
    # Skewed word frequencies so some terms sit in more than half the documents (negative Okapi idf).
    weights = [1.0 / (i + 1) ** 0.7 for i in range(len(vocab))]
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(0, 20))) for _ in range(n_docs)]


def reference_top_k(ref: BM25Okapi, query: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = ref.get_scores(query)
    order = np.lexsort((np.arange(len(scores)), -scores))[:k]
    keep = order[scores[order] > 0]
    return keep, scores[keep]


def test_tokenize_lowercases_and_splits_on_non_alphanumerics() -> None:
    assert tokenize("What is 3x+4 = 19? Don't_panic, Ünïcode!") == [
        "what", "is", "3x", "4", "19", "don", "t", "panic", "ünïcode",
    ]  # fmt: skip


def test_okapi_idf_matches_rank_bm25_including_the_epsilon_floor() -> None:
    docs = [tokenize(d) for d in random_corpus(1, 200, WORDS)]
    ref = BM25Okapi(docs)
    words = sorted(ref.idf)
    doc_freqs = np.array([sum(w in set(d) for d in docs) for w in words])
    ours = okapi_idf(doc_freqs, len(docs), 0.25)
    np.testing.assert_allclose(ours, [ref.idf[w] for w in words], rtol=1e-12)
    assert any(ref.idf[w] > 0 and ours[i] > 0 and doc_freqs[i] > 100 for i, w in enumerate(words))  # floored terms


@pytest.mark.parametrize("seed", range(6))
def test_scores_and_top10_equal_rank_bm25(seed: int) -> None:
    vocab = WORDS + [f"w{i}" for i in range(seed * 20)]
    corpus = random_corpus(seed, 300 + 100 * seed, vocab)
    index = BM25Index(corpus, ids=range(1000, 1000 + len(corpus)), idf="okapi")
    ref = BM25Okapi([tokenize(d) for d in corpus])
    rng = random.Random(seed + 100)
    for _ in range(30):
        query = " ".join(rng.choices([*vocab, "unseen"], k=rng.randint(1, 6)))
        np.testing.assert_allclose(index.scores(query), ref.get_scores(tokenize(query)), rtol=1e-9, atol=1e-12)
        positions, ref_scores = reference_top_k(ref, tokenize(query), 10)
        ours = index.top_k(query, 10)
        assert [i for i, _ in ours] == [1000 + int(p) for p in positions]
        np.testing.assert_allclose([s for _, s in ours], ref_scores, rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    corpus=st.lists(st.text(alphabet="abc xyz1", max_size=30), min_size=1, max_size=40),
    query=st.text(alphabet="abc xyz1", max_size=12),
)
def test_scores_equal_rank_bm25_on_arbitrary_corpora(corpus: list[str], query: str) -> None:
    tokens = [tokenize(d) for d in corpus]
    if not any(tokens):
        assert not BM25Index(corpus, idf="okapi").scores(query).any()
        return
    ref = BM25Okapi(tokens)
    ours = BM25Index(corpus, idf="okapi").scores(query)
    np.testing.assert_allclose(ours, ref.get_scores(tokenize(query)), atol=1e-9)


def test_repeated_query_tokens_count_every_time_like_rank_bm25() -> None:
    corpus = random_corpus(3, 100, WORDS)
    ref = BM25Okapi([tokenize(d) for d in corpus])
    ours = BM25Index(corpus, idf="okapi").scores("apple apple km")
    np.testing.assert_allclose(ours, ref.get_scores(["apple", "apple", "km"]))


@pytest.mark.parametrize("seed", range(3))
def test_lucene_idf_scores_are_bm25s_lucene_times_k1_plus_1(seed: int) -> None:
    """The default idf is Lucene's: bm25s's `lucene` method, whose term-frequency part drops BM25Okapi's (k1 + 1)."""
    import bm25s

    corpus = random_corpus(seed, 200, WORDS)
    tokens = [tokenize(d) or ["<empty>"] for d in corpus]  # bm25s takes no empty document
    reference = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    reference.index(tokens, show_progress=False)
    index = BM25Index([" ".join(t) for t in tokens])
    rng = random.Random(seed + 7)
    for _ in range(20):
        query = rng.choices(WORDS, k=rng.randint(1, 5))
        np.testing.assert_allclose(index.scores(query), 2.5 * reference.get_scores(query), rtol=1e-5)
    df = np.array([1, 50, 199, 200])
    assert (lucene_idf(df, 200) > 0).all() and (np.diff(lucene_idf(df, 200)) < 0).all()


LESSONS = (
    "Flow of thought: add the two numbers digit by digit. Principles: carry a ten. Pitfalls: a sign dropped.",
    "Flow of thought: read the units first. Principles: convert km to metres. Pitfalls: hours against minutes.",
)


@pytest.mark.parametrize("n_lessons", [1, 2])
def test_a_pool_of_one_or_two_lessons_ranks_the_related_one_with_a_positive_score(n_lessons: int) -> None:
    """BM25Okapi scores every word of a pool of one or two lessons at zero or less (its idf), so its stage 1 finds
    nothing there; Lucene's idf ranks the lesson that shares the question's words first, with a positive score."""
    lessons = LESSONS[:n_lessons]
    question = "What is 17 + 25? Add the numbers and carry."
    assert BM25Index(lessons, idf="okapi").top_k(question, 5) == []
    hits = BM25Index(lessons, ids=[10, 11][:n_lessons]).top_k(question, 5)
    assert hits[0][0] == 10 and hits[0][1] > 0
    assert all(score < hits[0][1] for _, score in hits[1:])  # the other lesson shares only "the"


def test_an_unknown_idf_is_refused() -> None:
    with pytest.raises(ValueError, match="lucene, okapi"):
        BM25Index(["a"], idf="bm25+")


def test_exclude_unknown_and_empty() -> None:
    index = BM25Index(["red apple", "green apple", "blue sky"], ids=[10, 11, 12])
    assert [i for i, _ in index.top_k("apple", 5)] == [10, 11] or [i for i, _ in index.top_k("apple", 5)] == [11, 10]
    assert 10 not in [i for i, _ in index.top_k("apple red", 5, exclude=[10])]
    assert index.top_k("nothing matches", 5) == []
    assert index.top_k("", 5) == []
    assert BM25Index([]).top_k("apple", 3) == []


def test_top_k_breaks_ties_by_position_even_at_the_cut() -> None:
    scores = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.0])
    ids = np.arange(100, 106)
    assert top_k_positions(scores, 3, ids) == [(101, 3.0), (102, 2.0), (103, 2.0)]
    assert top_k_positions(scores, 10, ids)[-1] == (100, 1.0)  # zero scores are not hits
