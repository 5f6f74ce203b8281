"""`lanpo embed`, `lanpo relevance build|status`, `lanpo retrieve` end to end against the test database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from lanpo.retrieval.relevance import store_scores
from tests.db.store_helpers import assert_planned_within_growth
from tests.retrieval.helpers import POOL, make_experiences, make_problems, pool_id


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random causal LM saved as a plain HF folder: what `--scorer PATH` loads."""
    from lanpo.models import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(seed=0)
    path = tmp_path_factory.mktemp("tiny-judge")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.usefixtures("fresh_statistics")  # it asserts the planner's statistics
def test_relevance_build_and_status(session: Session, run_cli, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """Build, rebuild (nothing left to score), status. The store holds one score already, its commit analyzed: the
    build's 15 pairs share its page, so only the rows the build added (lanpo.db.stats) keep the planner's count of
    relevance_scores within 10x when the command returns (by pages alone it stays 1)."""
    ids = make_problems(session)
    store_scores(session, "an-earlier-judge", {(ids[0], ids[1]): 0.5})
    session.commit()
    args = ["relevance", "build", "--dataset", "toy", "--top-k", "2", "--scorer", tiny_model_dir, "--stage1", "bm25"]
    first = run_cli(*args, "--batch-size", "4", "--device", "cpu", "--no-progress")
    assert first.code == 0, first.err
    assert "8 problems" in first.out and "0 already scored" in first.out and "pairs/s" in first.out
    assert_planned_within_growth(session.get_bind(), "relevance_scores")
    again = run_cli(*args, "--device", "cpu", "--no-progress")
    assert again.code == 0 and "scored now" in again.out and ", 0 scored now" in again.out
    status = run_cli("relevance", "status", "--dataset", "toy", "--gamma", "0")
    assert status.code == 0 and f"{tiny_model_dir}|relevance-v2" in status.out


def test_relevance_build_vector_without_embeddings_fails_with_a_hint(session: Session, run_cli) -> None:  # type: ignore[no-untyped-def]
    make_problems(session)
    session.commit()
    result = run_cli("relevance", "build", "--dataset", "toy", "--stage1", "vector", "--scorer", "/no/such/model")
    assert result.code == 2
    assert "error:" in result.err and "/no/such/model" in result.err


def test_retrieve_prints_experiences_or_says_zero_shot(session: Session, run_cli) -> None:  # type: ignore[no-untyped-def]
    args = ("retrieve", "How many apples?", "--stage1", "bm25", "--scorer", "none")
    none = run_cli(*args)
    assert none.code == 2 and "no experience pool yet" in none.err
    pool_id(session)
    session.commit()
    empty = run_cli(*args)
    assert empty.code == 0 and "zero-shot" in empty.out
    ids = make_problems(session)
    make_experiences(
        session, [(ids[0], "apples: add the apples"), (ids[1], "speed times time"), (ids[2], "sum the terms")]
    )
    session.commit()
    result = run_cli(*args, "--m", "2")
    assert result.code == 0, result.err
    assert (
        result.out.startswith("#1 version") and "apples: add the apples" in result.out and "relevance -" in result.out
    )
    other_pool = [(ids[3], "apples, apples, apples"), (ids[5], "distance: speed and time"), (ids[6], "add terms")]
    make_experiences(session, other_pool, pool="other")
    session.commit()
    ambiguous = run_cli(*args)
    assert ambiguous.code == 2 and "holds 2 pools" in ambiguous.err and "--pool" in ambiguous.err
    other = run_cli(*args, "--pool", "other")
    assert other.code == 0 and "apples, apples, apples" in other.out and "add the apples" not in other.out
    unknown = run_cli(*args, "--pool", "nope")
    assert unknown.code == 2 and "no pool named 'nope'" in unknown.err and "other" in unknown.err


def test_retrieve_on_an_empty_pool_says_so_before_loading_a_model(
    session: Session, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The default judge (SmolLM2) and the hybrid stage 1 (MiniLM) would each load a model: neither may."""
    import lanpo.models.gguf
    import lanpo.retrieval.judge
    import lanpo.retrieval.testtime

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded for an empty pool")

    monkeypatch.setattr(lanpo.retrieval.judge, "load_judge", no_model)
    monkeypatch.setattr(lanpo.retrieval.testtime, "default_embedder", no_model)
    monkeypatch.setattr(lanpo.models.gguf, "prepare_smollm2", no_model)
    pool_id(session)
    session.commit()
    empty = run_cli("retrieve", "How many apples?", "--stage1", "hybrid")  # --judge smollm2, the default
    assert empty.code == 0, empty.err
    assert empty.out == f"no experiences: pool {POOL!r} holds no active lesson yet, so answer zero-shot\n"


def test_embed_with_a_missing_model_is_a_user_error(session: Session, run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("embed", "--dataset", "toy", "--model", "/no/such/embedder")
    assert result.code == 2 and "error:" in result.err and "/no/such/embedder" in result.err
