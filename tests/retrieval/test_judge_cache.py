"""The judge's scores kept by question text (`judge_cache`, migration 0021): a question asked again reaches no judge;
a lesson version, a judge or a question the cache has not seen does; a version's delete takes its scores; a write
the store refuses never fails retrieval."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db.repo.judge_cache import question_sha256
from lanpo.retrieval.corpus import BM25Cache
from lanpo.retrieval.judge import PROMPT_VERSION
from lanpo.retrieval.testtime import judged, retrieve
from tests.retrieval.helpers import QUESTIONS, make_experiences, make_problems, pool_id

ASKED = "Tom has 4 apples and buys 9 more apples. How many apples does Tom have now?"  # no stored problem


class CountingJudge:
    """A judge that scores every pair `value` and keeps each pair it was asked (no model)."""

    batch_size = 8

    def __init__(self, identity: str = f"fake|{PROMPT_VERSION}", value: float = 0.75) -> None:
        self._identity, self.value = identity, value
        self.pairs: list[tuple[str, str]] = []

    @property
    def identity(self) -> str:
        return self._identity

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        self.pairs.extend(pairs)
        return [self.value] * len(pairs)


def _retrieve(session: Session, judge: CountingJudge, question: str = ASKED) -> list[tuple[int, float | None]]:
    found = retrieve(session, question, pool_id=pool_id(session), rater=judge, gamma=0.0, m=8, cache=BM25Cache())
    return [(h.experience_version_id, h.relevance) for h in found]


def _cached(session: Session) -> int:
    return int(session.scalar(sa.text("SELECT count(*) FROM judge_cache")))


def test_a_question_asked_again_reaches_no_judge(session: Session) -> None:
    ids = make_problems(session)
    make_experiences(session, [(ids[i], QUESTIONS[i]) for i in range(4)])
    judge = CountingJudge()
    first = _retrieve(session, judge)
    asked = len(judge.pairs)
    assert asked >= 2 and _cached(session) == asked and {q for q, _ in judge.pairs} == {ASKED}

    again = CountingJudge(value=0.1)  # the same identity: what it would say now is never asked
    assert _retrieve(session, again) == first and again.pairs == []

    other = CountingJudge(identity=f"other-model|{PROMPT_VERSION}", value=0.2)  # other weights: all judged anew
    assert {r for _, r in _retrieve(session, other)} == {0.2} and len(other.pairs) == asked
    changed = CountingJudge(value=0.3)
    assert len(_retrieve(session, changed, ASKED + " ")) >= 1 and len(changed.pairs) >= 1  # other text, other key

    (new_version,) = make_experiences(session, [(ids[4], "apples: count the apples he buys, then add them")])
    late = CountingJudge(value=0.9)
    found = dict(_retrieve(session, late))
    assert late.pairs == [(ASKED, "apples: count the apples he buys, then add them")]  # only the unseen version
    assert found[new_version] == 0.9 and {r for v, r in found.items() if v != new_version} == {0.75}


def test_a_deleted_version_takes_its_scores(session: Session) -> None:
    ids = make_problems(session)
    versions = make_experiences(session, [(ids[i], QUESTIONS[i]) for i in range(4)])
    judged(session, CountingJudge(), ASKED, [(v, "a lesson") for v in versions])
    assert _cached(session) == len(versions)
    session.execute(
        sa.text("DELETE FROM experiences WHERE id = (SELECT experience_id FROM experience_versions WHERE id = :v)"),
        {"v": versions[0]},
    )
    rows = session.scalars(sa.text("SELECT version_id FROM judge_cache ORDER BY version_id")).all()
    assert rows == sorted(versions[1:])
    key = session.scalar(sa.text("SELECT DISTINCT question_sha256 FROM judge_cache"))
    assert bytes(key) == question_sha256(ASKED)


def test_a_refused_write_never_fails_retrieval(session: Session, caplog: pytest.LogCaptureFixture) -> None:
    judge = CountingJudge()
    with caplog.at_level("WARNING", logger="lanpo.retrieval.testtime"):
        assert judged(session, judge, ASKED, [(10**12, "a version that does not exist")]) == [0.75]
    assert "judge_cache: 1 new score(s) not stored" in caplog.text
    assert session.scalar(sa.text("SELECT 1")) == 1 and _cached(session) == 0  # the transaction goes on
