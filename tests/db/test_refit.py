"""`lanpo serve`'s verdicts refit their pool's lesson fit after their commit, as a group commit (`lanpo.serve.refit`):
each verdict's request returns once a refit begun after its commit has ended, so the stored fit then counts it; a
burst of verdicts shares refits. The reference: the same fit computed afresh over the committed uses, in a
transaction rolled back."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from store_helpers import make_experiences, make_pool, make_problems

from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.serving import record_feedback
from lanpo.serve.refit import Refitter

FIT = sa.text("SELECT version_id, net_credit, net_credit_var FROM lesson_usefulness ORDER BY version_id")


def _served(db: Engine, questions: int = 6, name: str = "refit") -> tuple[int, list[int]]:
    """A pool of 4 lessons and a serving-shaped run: per question a retrieval answer reading two of them (ungraded,
    as a server writes it) and a graded zero-shot answer; the pool and the retrieval answers."""
    with transaction(db) as s:
        problems = make_problems(s, questions, dataset=name)
        pool = make_pool(s, name)
        versions = make_experiences(s, problems[0], 4, pool)
        run = runs_repo.create_run(s, f"{name}-serve", "serve", {}, pool_id=pool.id).id
        answers = []
        for i, p in enumerate(problems):
            lessons = [ContextRef(j, experience_version_id=versions[(i + j) % 4]) for j in range(2)]
            zero = [NewAttempt("z", 1.0, True), NewAttempt("z", 0.0, False)]
            (answer,), _ = record_groups(s, [
                NewGroup(p, "retrieval", "q", [NewAttempt("r")], step=i, run_id=run, contexts=lessons),
                NewGroup(p, "zero_shot", "q", zero, step=i, run_id=run),
            ])  # fmt: skip
            answers.append(answer)
    return pool.id, answers


def _verdict(db: Engine, answer: int, correct: bool) -> None:
    with transaction(db) as s:
        record_feedback(s, answer, reward=None, correct=correct, gold_answer=None, key_name="k", fit=False)


def _stored(db: Engine) -> list[tuple[int, float, float]]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(FIT)]


def _afresh(db: Engine, *pools: int) -> list[tuple[int, float, float]]:
    """The pools' fit over every committed use, computed now and rolled back."""
    with db.connect() as conn:
        outer = conn.begin()
        usefulness.fit_pools(conn, list(pools))
        fit = [tuple(r) for r in conn.execute(FIT)]
        outer.rollback()
    return fit


def test_a_verdict_returns_once_the_stored_fit_counts_it(db: Engine) -> None:
    """Verdict by verdict: committed without the fit (the stored fit then differs from a fresh one), and equal to a
    fresh one once `settle` returns."""
    pool, answers = _served(db)
    refitter = Refitter(db, ThreadPoolExecutor(2))
    for i, answer in enumerate(answers[:4]):
        _verdict(db, answer, correct=i % 3 == 0)
        assert _stored(db) != _afresh(db, pool)  # the verdict moved the fit, and its transaction left it as it was
        asyncio.run(refitter.settle([pool]))
        assert _stored(db) == _afresh(db, pool)
    assert refitter.stats() == {"refits": 4, "verdicts": 4}


def test_verdicts_during_a_refit_share_the_next_one(db: Engine) -> None:
    """The first verdict's refit is held (its executor busy) while five more verdicts commit and wait: they all take
    the next refit, two refits for six verdicts (one apiece before); the stored fit then counts all six."""
    pool, answers = _served(db)
    executor, gate = ThreadPoolExecutor(1), threading.Event()
    refitter = Refitter(db, executor)

    async def burst() -> None:
        loop = asyncio.get_running_loop()
        executor.submit(gate.wait, 30)  # the refitter's one worker is busy: refit 1 waits behind it
        _verdict(db, answers[0], correct=True)
        first = asyncio.create_task(refitter.settle([pool]))
        await asyncio.sleep(0.1)  # refit 1 has begun (queued), with the first verdict's pool
        rest = []
        for i, answer in enumerate(answers[1:]):
            await loop.run_in_executor(None, _verdict, db, answer, i % 2 == 0)
            rest.append(asyncio.create_task(refitter.settle([pool])))
        await asyncio.sleep(0.1)
        assert refitter.stats() == {"refits": 0, "verdicts": 0}  # every request is waiting
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 60)

    asyncio.run(burst())
    assert refitter.stats() == {"refits": 2, "verdicts": 6}
    assert _stored(db) == _afresh(db, pool)


def test_a_failed_refit_is_an_error_for_its_verdict_and_its_pool_is_refit_next(db: Engine, pg_url: str) -> None:
    """The store is unreachable for the first refit (a database that does not exist): the verdict that waited on it
    gets the error, and its pool stays asked for, so the next refit, asked for by a verdict of another pool once the
    store is back, fits both."""
    first, (answer,) = _served(db, questions=1, name="refit-a")
    second, (other,) = _served(db, questions=1, name="refit-b")
    gone = sa.create_engine(sa.engine.make_url(pg_url).set(database="no_such_database"))
    refitter = Refitter(gone, ThreadPoolExecutor(1))
    _verdict(db, answer, correct=True)
    with pytest.raises(Exception, match="no_such_database"):
        asyncio.run(refitter.settle([first]))
    assert refitter.stats() == {"refits": 0, "verdicts": 0} and _stored(db) != _afresh(db, first, second)
    refitter.db = db  # the store is back
    _verdict(db, other, correct=False)
    asyncio.run(refitter.settle([second]))
    assert refitter.stats() == {"refits": 1, "verdicts": 1}
    assert _stored(db) == _afresh(db, first, second)  # the first pool's verdict counted too
    gone.dispose()
