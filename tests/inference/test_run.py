"""`lanpo.inference.run`: a check writes nothing, a run records what it answered, a failure keeps what was recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.orm import Session

from lanpo.db.repo.problems import Question
from lanpo.errors import InputError
from lanpo.inference.answerer import Answerer
from lanpo.inference.run import InferenceRun, answering, pool_id

COUNTED = ("problems", "runs", "rollout_groups", "attempts", "group_contexts", "policy_versions")


def counts(session: Session) -> dict[str, int]:
    session.rollback()  # read what is committed now
    return {t: int(session.scalar(sa.text(f"SELECT count(*) FROM {t}"))) for t in COUNTED}


QUESTIONS = [Question("a", "What is 1+2?", "3"), Question("b", "What is 2+2?", "4")]


def test_a_check_refuses_what_the_store_would_and_writes_nothing(db: SAEngine, session: Session) -> None:
    before = counts(session)
    run = InferenceRun.check(db, "fresh", "infer", "m", dataset="quiz", questions=QUESTIONS)
    assert (run.run_id, run.dataset) == (None, "quiz")
    assert counts(session) == before  # the dry run was rolled back
    opened = InferenceRun.check(db, "taken", "infer", "m", dataset="quiz", questions=QUESTIONS)
    opened.open({}, None, QUESTIONS)
    before = counts(session)
    with pytest.raises(InputError, match="a run named 'taken' already exists"):
        InferenceRun.check(db, "taken", "eval", "m")
    clash = [Question("a", "Something else?", "3")]
    with pytest.raises(InputError, match="already holds problem"):
        InferenceRun.check(db, "other", "infer", "m", dataset="quiz", questions=clash)
    with pytest.raises(InputError, match="no pool named 'nosuch'"):
        pool_id(db, "nosuch")
    assert counts(session) == before


def test_a_run_records_each_batch_and_finishes(
    db: SAEngine, session: Session, make_answerer: Callable[..., Answerer], pool: dict[str, Any]
) -> None:
    answerer = make_answerer()
    run = InferenceRun.check(db, "served", "infer", "tiny", pool_id=pool_id(db, "trained"), dataset="quiz")
    # BM25 finds a lesson
    asked = [Question(q.external_id, f"{q.question} Use addition.", q.answer) for q in QUESTIONS]
    questions = run.open({"mode": "retrieval"}, None, asked)
    assert all(q.problem_id is not None for q in questions)
    with answering(run, len(questions), "test", show=False) as (_, keep):
        solutions = answerer.solve(questions, "retrieval", 2, on_batch=keep)
    status, pool_of_run = session.execute(sa.text("SELECT status, pool_id FROM runs WHERE name = 'served'")).one()
    assert (status, pool_of_run) == ("finished", pool["pool"].id)
    stored = session.scalar(
        sa.text("SELECT count(*) FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE g.run_id = :r"),
        {"r": run.run_id},
    )
    assert stored == 2 * len(questions)
    read = set(session.scalars(sa.text("SELECT experience_version_id FROM group_contexts")))
    assert read == {e.experience_version_id for s in solutions for e in s.experiences} and read


def test_a_failure_marks_the_run_failed_and_keeps_what_was_recorded(
    db: SAEngine, session: Session, make_answerer: Callable[..., Answerer]
) -> None:
    answerer = make_answerer()
    run = InferenceRun.check(db, "broken", "infer", "tiny", dataset="quiz")
    questions = run.open({}, None, QUESTIONS)
    with pytest.raises(KeyboardInterrupt), run.running():
        run.record(answerer.solve(questions[:1], "zero_shot", 1))
        raise KeyboardInterrupt  # Ctrl-C between two answers
    assert session.scalar(sa.text("SELECT status FROM runs WHERE name = 'broken'")) == "failed"
    assert session.scalar(sa.text("SELECT count(*) FROM attempts")) == 1


def test_recording_needs_an_open_run(db: SAEngine) -> None:
    run = InferenceRun.check(db, "unopened", "infer", "tiny")
    with pytest.raises(RuntimeError, match="not open"):
        run.record([])


def test_one_request_at_a_time_stores_its_question_with_its_answer(
    db: SAEngine, session: Session, make_answerer: Callable[..., Answerer]
) -> None:
    """A server's way: no questions at open; each answer recorded alone, its question becoming a problem then."""
    answerer = make_answerer()
    run = InferenceRun.check(db, None, "infer", "tiny", dataset="requests")
    assert run.name.startswith("infer-")
    run.open({}, None)
    with run.running():
        ids = [run.record(answerer.solve(["What is 3+4?"], "zero_shot", 2))[0] for _ in range(2)]  # asked twice
    problems = session.execute(sa.text("SELECT dataset, question FROM problems")).all()
    assert problems == [("requests", "What is 3+4?")]  # one problem, however often it is asked
    answered = sa.text("SELECT a.id FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE g.run_id = :r")
    stored = set(session.scalars(answered, {"r": run.run_id}))
    assert len(stored) == 4 and set(ids) <= stored
