"""Merging near-duplicate lessons (store.merge_threshold): a paraphrase of an active lesson becomes its next version;
an unrelated lesson, an operation swapped (which all-MiniLM-L6-v2 embeds closer than the paraphrase) or a lesson of
another problem stays a lesson of its own; concurrent writers of one paraphrase make one version, never two
lessons; a resume rolls a merge back. The lessons here are written the way the summariser writes them, in the
lesson's three sections, at its length."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import make_pool, make_problems

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.errors import InputError
from lanpo.feedback.record import embed_lessons

LESSON = """## Flow
Read the numbers from left to right and keep a running total.
## Principles
Add each new term to the total before moving on; carry tens into the next column.
## Pitfalls
Do not drop a term that follows a minus sign; check the total once at the end."""
PARAPHRASE = """## Flow
Go through the numbers left to right, keeping a running total.
## Principles
Before moving on, add every new term to the total and carry the tens to the next column.
## Pitfalls
Never skip a term after a minus sign; check the total again at the end."""
UNRELATED = """## Flow
Find the two trains' speeds and the distance that separates them at the start.
## Principles
Relative speed is the sum of both speeds when they travel towards each other.
## Pitfalls
Convert minutes to hours first; the answer is the meeting time, not a distance."""
SWAPPED = LESSON.replace("Add each new term to", "Multiply each new term into")  # cosine 0.99 to LESSON

MERGING = StoreConfig(per_problem_cap=32, per_step_cap=8, merge_threshold=0.9)


def _lessons(problem_id: int, *texts: str, reward: float = 1.0, **kwargs: object) -> list[NewExperience]:
    return [NewExperience(problem_id, text, reward=reward, **kwargs) for text in texts]  # type: ignore[arg-type]


def _add(session: Session, pool, items: list[NewExperience]):  # type: ignore[no-untyped-def]
    embed_lessons(session, pool, items)  # what the store client does: the shared all-MiniLM-L6-v2
    return add_experiences(session, pool, items)


def _chain(session: Session, experience_id: int) -> list[tuple]:
    return [
        tuple(r)
        for r in session.execute(
            sa.text(
                "SELECT version, reason, similarity, summary, reward, source_attempt_id FROM experience_versions "
                "WHERE experience_id = :e ORDER BY version"
            ),
            {"e": experience_id},
        )
    ]


def test_a_paraphrase_becomes_version_2_and_an_unrelated_lesson_or_a_swapped_operation_does_not(
    session: Session,
) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "merging", MERGING)
    first = _add(session, pool, _lessons(problem, LESSON, reward=1.0))
    (lesson,) = first.experience_ids

    merged = _add(session, pool, _lessons(problem, PARAPHRASE, UNRELATED, SWAPPED, reward=1.1))
    assert merged.merged == [0] and merged.duplicates == []
    assert merged.experience_ids[0] == lesson and len(set(merged.experience_ids)) == 3
    chain = _chain(session, lesson)
    assert [(v, reason, text, reward) for v, reason, _, text, reward, _ in chain] == [
        (1, "new", LESSON, 1.0),
        (2, "merge:newer", PARAPHRASE, 1.1),
    ]
    assert 0.93 < chain[1][2] < 0.99  # the paraphrase's cosine, recorded on its version
    active = session.scalar(sa.text("SELECT count(*) FROM experiences WHERE evicted_at IS NULL"))
    assert active == 3  # the lesson (now at version 2), the unrelated one, the swapped operation


def test_the_same_text_again_and_a_lower_reward_under_higher_reward_add_no_version(session: Session) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "best", StoreConfig(merge_threshold=0.9, merge_keeps="higher_reward"))
    (lesson,) = _add(session, pool, _lessons(problem, LESSON, reward=1.0)).experience_ids
    again = _add(session, pool, _lessons(problem, "  " + LESSON.upper() + "\n", reward=1.1))
    lower = _add(session, pool, _lessons(problem, PARAPHRASE, reward=0.5))
    assert (again.duplicates, again.version_ids, lower.duplicates, lower.version_ids) == ([0], [], [0], [])
    higher = _add(session, pool, _lessons(problem, PARAPHRASE, reward=1.1))
    assert higher.merged == [0] and higher.experience_ids == [lesson]
    assert [c[1] for c in _chain(session, lesson)] == ["new", "merge:higher_reward"]


def test_a_paraphrase_of_another_problems_lesson_stays_its_own(session: Session) -> None:
    """Inter feedback never shows a problem its own lessons: a version from problem b must not join a's lesson."""
    a, b = make_problems(session, 2)
    pool = make_pool(session, "two", MERGING)
    _add(session, pool, _lessons(a, LESSON))
    result = _add(session, pool, _lessons(b, PARAPHRASE))
    assert result.merged == [] and len(result.experience_ids) == 1
    assert session.scalar(sa.text("SELECT count(*) FROM experience_versions WHERE version > 1")) == 0


def test_two_paraphrases_in_one_call_merge_into_the_first(session: Session) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "one-call", MERGING)
    result = _add(session, pool, _lessons(problem, LESSON, PARAPHRASE))
    assert result.merged == [1] and result.experience_ids[0] == result.experience_ids[1]


def test_a_merging_pool_refuses_a_lesson_without_its_embedding_and_writes_nothing(session: Session) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "strict", MERGING)
    with pytest.raises(InputError, match="no embedding"):
        add_experiences(session, pool, _lessons(problem, LESSON))
    session.rollback()
    assert session.scalar(sa.text("SELECT count(*) FROM experiences")) == 0


def test_a_resume_rolls_back_the_versions_its_undone_steps_merged(session: Session) -> None:
    (problem,) = make_problems(session, 1)
    pool = make_pool(session, "resume", MERGING)
    run = runs_repo.create_run(session, "resume", "train", {}, pool_id=pool.id).id
    (lesson,) = _add(session, pool, _lessons(problem, LESSON, run_id=run, step=1)).experience_ids
    merged = _add(session, pool, _lessons(problem, PARAPHRASE, run_id=run, step=2))
    assert merged.merged == [0]
    rolled = steps_repo.rollback_uncommitted(session, run, 1)
    assert rolled.versions == 1
    assert [c[:2] for c in _chain(session, lesson)] == [(1, "new")]


def _topic_vector(topic: int, rng: np.random.Generator, dim: int = 384) -> list[float]:
    """A lesson's embedding near its topic's axis (cosine about 0.99 within a topic, about 0 across)."""
    vector = np.zeros(dim)
    vector[topic] = 1.0
    vector += rng.normal(0.0, 0.005, dim)
    return list(vector / np.linalg.norm(vector))


def test_concurrent_writers_of_one_paraphrase_make_versions_never_two_lessons(db: Engine) -> None:
    """8 writers, 6 rounds, each writing every topic of every problem in new words at once (under the caps' locks):
    one active lesson per (problem, topic), every writer's merge a version of it, none lost, numbered 1..n."""
    store = StoreConfig(per_problem_cap=3, per_step_cap=8, merge_threshold=0.9, eviction="lowest_reward")
    with transaction(db) as session:
        pids = make_problems(session, 3)
        pool = make_pool(session, "race", store)
    writers, rounds, topics = 8, 6, 3
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    results = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers)
    lock = threading.Lock()

    def writer(w: int) -> None:
        rng = np.random.default_rng(w)
        try:
            barrier.wait()
            for r in range(rounds):
                order = pids if (w + r) % 2 else list(reversed(pids))
                items = [
                    NewExperience(
                        p, f"topic {t}: carry the tens, in the words of {words[w]} {words[r]}", reward=1.0,
                        embedding=_topic_vector(t, rng),
                    )
                    for p in order
                    for t in range(topics)
                ]  # fmt: skip
                with transaction(db) as session:
                    result = add_experiences(session, pool, items)
                with lock:
                    results.append((items, result))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with db.connect() as conn:
        versions = conn.execute(
            sa.text(
                "SELECT e.id, e.problem_id, e.evicted_at IS NULL AS active, v.version, v.reason, v.summary "
                "FROM experiences e JOIN experience_versions v ON v.experience_id = e.id ORDER BY e.id, v.version"
            )
        ).all()
    merged = sum(len(result.merged) for _, result in results)
    created = sum(len(result.experience_ids) - len(result.merged) for _, result in results)
    assert sum(1 for v in versions if v.reason == "merge:newer") == merged > 0  # no version lost
    assert sum(1 for v in versions if v.reason == "new") == created
    assert sum(len(result.duplicates) for _, result in results) == 0  # every writer's words differ
    by_lesson: dict[int, list[int]] = {}
    for v in versions:
        by_lesson.setdefault(v.id, []).append(v.version)
    assert all(numbers == list(range(1, len(numbers) + 1)) for numbers in by_lesson.values())
    current = {}
    for v in versions:
        current[v.id] = v
    active_topics = [(v.problem_id, v.summary.split(":")[0]) for v in current.values() if v.active]
    assert len(active_topics) == len(set(active_topics)) == len(pids) * topics  # one lesson per topic, no twins


def test_the_threshold_merges_at_its_value_and_not_below(session: Session) -> None:
    """merge_threshold 1.0 with unit vectors pgvector scores exactly: the same direction (cosine 1.0, at the
    threshold) merges; a direction at cosine 0.9999 (below it) does not. Above it: the paraphrase test."""
    a, b = make_problems(session, 2)
    pool = make_pool(session, "exact", StoreConfig(merge_threshold=1.0))
    axis = [1.0] + [0.0] * 383
    tilted = [0.9999, (1 - 0.9999**2) ** 0.5] + [0.0] * 382
    for problem in (a, b):
        add_experiences(session, pool, [NewExperience(problem, LESSON, reward=1.0, embedding=axis)])
    at = add_experiences(session, pool, [NewExperience(a, PARAPHRASE, reward=1.0, embedding=axis)])
    below = add_experiences(session, pool, [NewExperience(b, PARAPHRASE, reward=1.0, embedding=tilted)])
    assert at.merged == [0] and below.merged == [] and len(below.experience_ids) == 1
