"""Embedding into pgvector: resumable batches, the dimension check, embed-on-insert, and the real MiniLM (slow)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.models import Problem
from lanpo.errors import InputError
from lanpo.retrieval.embeddings import column_dim, embed_missing, embed_on_insert, fill_embeddings
from tests.retrieval.helpers import QUESTIONS, HashEmbedder, make_experiences, make_problems


def stored(session: Session, table: str) -> dict[int, np.ndarray | None]:
    rows = session.execute(sa.text(f"SELECT id, CAST(embedding AS text) FROM {table} ORDER BY id")).all()
    return {i: None if e is None else np.array(e.strip("[]").split(","), dtype=np.float32) for i, e in rows}


class FailingEmbedder(HashEmbedder):
    def __init__(self, fail_on_call: int) -> None:
        super().__init__()
        self.fail_on_call = fail_on_call

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        if self.calls + 1 == self.fail_on_call:
            raise KeyboardInterrupt
        return super().encode(texts, batch_size)


def test_embed_fills_problems_and_versions_and_resumes_after_an_interruption(session: Session, db: Engine) -> None:
    ids = make_problems(session)
    make_problems(session, "other", ["another dataset's question"])
    make_experiences(session, [(ids[0], "add the apples"), (ids[1], "speed times time")])
    session.commit()
    with pytest.raises(KeyboardInterrupt):
        embed_missing(db, FailingEmbedder(fail_on_call=3), dataset="toy", batch_size=3, progress=False)
    after_kill = stored(session, "problems")
    assert sum(v is not None for v in after_kill.values()) == 6  # two batches of 3 committed
    embedder = HashEmbedder()
    count = embed_missing(db, embedder, dataset="toy", batch_size=3, progress=False)
    assert (count.problems, count.experience_versions) == (2, 2)
    problems = stored(session, "problems")
    assert all(problems[i] is not None for i in ids)
    assert sum(v is None for v in problems.values()) == 1  # the other dataset is untouched
    np.testing.assert_allclose(problems[ids[3]], embedder.encode([QUESTIONS[3]])[0], atol=1e-6)
    assert embed_missing(db, embedder, dataset="toy", progress=False).problems == 0  # nothing left: a no-op


def test_wrong_dimension_names_both_sizes(session: Session, db: Engine) -> None:
    make_problems(session)
    session.commit()
    assert column_dim(session, "problems") == 384
    with pytest.raises(InputError, match=r"gives 8-d vectors but problems\.embedding is vector\(384\)"):
        embed_missing(db, HashEmbedder(dim=8), dataset="toy", what="problems", progress=False)


def test_embed_on_insert_fills_new_orm_rows(session: Session) -> None:
    embedder = HashEmbedder()
    remove = embed_on_insert(session, embedder)
    session.add(Problem(dataset="orm", external_id="1", question="Sam has 5 apples."))
    session.commit()
    remove()
    session.add(Problem(dataset="orm", external_id="2", question="not embedded"))
    session.commit()
    vectors = list(stored(session, "problems").values())
    np.testing.assert_allclose(vectors[0], embedder.encode(["Sam has 5 apples."])[0], atol=1e-6)
    assert vectors[1] is None


def test_fill_embeddings_before_a_repository_insert(session: Session) -> None:
    from lanpo.db.repo.experiences import NewExperience, add_experiences

    ids = make_problems(session)
    embedder = HashEmbedder()
    items = [NewExperience(ids[0], "add the apples"), NewExperience(ids[1], "speed times time")]
    fill_embeddings(items, embedder)
    from lanpo.config import StoreConfig
    from lanpo.db.repo.pools import ensure_pool

    version_ids = add_experiences(session, ensure_pool(session, "p", StoreConfig()), items).version_ids
    vectors = stored(session, "experience_versions")
    np.testing.assert_allclose(vectors[version_ids[1]], embedder.encode(["speed times time"])[0], atol=1e-6)


def test_bad_what_is_refused(db: Engine) -> None:
    with pytest.raises(InputError, match="--what"):
        embed_missing(db, HashEmbedder(), dataset=None, what="everything")


@pytest.mark.slow
def test_real_minilm_embeds_through_the_cli(session: Session, run_cli) -> None:  # type: ignore[no-untyped-def]
    make_problems(session)
    session.commit()
    result = run_cli("embed", "--dataset", "toy", "--what", "problems", "--no-progress")
    assert result.code == 0, result.err
    assert "embedded 8 problems" in result.out and "384-d" in result.out
    vectors = stored(session, "problems")
    matrix = np.stack([vectors[i] for i in sorted(vectors)])
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-4)
    similarity = matrix @ matrix.T
    assert similarity[0, 4] > similarity[0, 1]  # two apple questions are closer than apples vs trains
