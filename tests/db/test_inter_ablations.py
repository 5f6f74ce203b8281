"""Table 2's inter ablations in the store: gamma = 0 draws with no relevance filter over the whole pool, and
shows = response shows the rollout behind a lesson instead of its summary (sample_inter_unfiltered.sql,
:shows_response)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from lanpo.db.repo.contexts import inter_contexts
from lanpo.db.repo.experiences import NewExperience, add_experiences
from tests.db.store_helpers import make_attempts, make_pool, make_problems, relevance


def test_gamma_zero_draws_from_the_whole_pool_without_relevance(session: Session) -> None:
    target, scored, unscored, far = make_problems(session, 4)
    pool = make_pool(session, "p")
    add_experiences(session, pool, [NewExperience(p, f"lesson of {p}") for p in (target, scored, unscored, far)])
    relevance(session, target, scored, 0.95)  # only one candidate was ever scored (stage 1's top-k, say)
    session.commit()
    filtered = inter_contexts(session, [target], k=4, candidates=8, seed=0, gamma=0.0, scorer="s", pool_id=pool.id)
    assert {i.source_problem_id for i in filtered[target]} == {scored}  # the scored rows are the limit there
    unfiltered = inter_contexts(session, [target], k=4, candidates=8, seed=0, gamma=0.0, scorer=None, pool_id=pool.id)
    got = unfiltered[target]
    assert {i.source_problem_id for i in got} == {scored, unscored, far}  # every other problem's lesson
    assert all(i.score == 0.0 for i in got)  # no relevance was read
    again = inter_contexts(session, [target], k=4, candidates=8, seed=0, gamma=0.0, scorer=None, pool_id=pool.id)
    assert [i.experience_version_id for i in again[target]] == [i.experience_version_id for i in got]


def test_gamma_zero_keeps_the_newest_candidates(session: Session) -> None:
    ids = make_problems(session, 6)
    pool = make_pool(session, "p")
    for p in ids[1:]:  # one at a time: created_at orders them
        add_experiences(session, pool, [NewExperience(p, f"lesson of {p}")])
        session.commit()
    drawn = inter_contexts(session, [ids[0]], k=2, candidates=2, seed=3, gamma=0.0, scorer=None, pool_id=pool.id)
    assert {i.source_problem_id for i in drawn[ids[0]]} == set(ids[-2:])


def test_raw_source_shows_the_rollout_behind_the_lesson(session: Session) -> None:
    target, other = make_problems(session, 2)
    (attempt,) = make_attempts(session, other, 1)
    pool = make_pool(session, "p")
    add_experiences(session, pool, [NewExperience(other, "abstract lesson", source_attempt_id=attempt)])
    relevance(session, target, other, 0.95)
    session.commit()
    for scorer in ("s", None):
        summary = inter_contexts(session, [target], 1, 4, 0, gamma=0.9 if scorer else 0.0, scorer=scorer,
                                 pool_id=pool.id)  # fmt: skip
        raw = inter_contexts(session, [target], 1, 4, 0, gamma=0.9 if scorer else 0.0, scorer=scorer,
                             pool_id=pool.id, shows_response=True)  # fmt: skip
        assert [i.summary for i in summary[target]] == ["abstract lesson"]
        assert [i.summary for i in raw[target]] == [f"response 0 to {other}"]
        assert raw[target][0].experience_version_id == summary[target][0].experience_version_id  # the same draw
