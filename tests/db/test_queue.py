"""The rollout queue on the real server: concurrent claims never share a row, a lapsed lease is redone, and only
the current claim's holder can finish a row, once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo import queue as queue_repo
from lanpo.db.repo import runs as runs_repo


@pytest.fixture
def run_id(db: Engine) -> int:
    with transaction(db) as session:
        return runs_repo.create_run(session, "queued", "train").id


def _enqueue(db: Engine, run_id: int, steps: range) -> None:
    with transaction(db) as session:
        for step in steps:
            assert queue_repo.enqueue(session, run_id, step, {"step": step}, step - 1) is not None
            assert queue_repo.enqueue(session, run_id, step, {"step": step}, step - 1) is None  # queued once


def test_concurrent_claims_take_every_row_once(db: Engine, run_id: int) -> None:
    _enqueue(db, run_id, range(1, 41))
    taken: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def claim_all(i: int) -> None:
        start.wait()
        while True:
            with transaction(db) as session:
                claim = queue_repo.claim(session, run_id, f"w{i}", lease_s=60)
            if claim is None:
                return
            taken[i].append(claim.step)

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    steps = sorted(s for got in taken for s in got)
    assert steps == list(range(1, 41))  # no row twice, none left
    assert sum(1 for got in taken if got) >= 2  # they did claim side by side


def test_a_lapsed_lease_is_redone_and_the_old_holder_can_neither_renew_nor_finish(db: Engine, run_id: int) -> None:
    _enqueue(db, run_id, range(1, 2))
    with transaction(db) as session:
        first = queue_repo.claim(session, run_id, "a", lease_s=0.5)
        assert first is not None and first.claims == 1
        assert queue_repo.claim(session, run_id, "b", lease_s=60) is None  # held
    time.sleep(0.7)
    with transaction(db) as session:
        second = queue_repo.claim(session, run_id, "b", lease_s=60)
    assert second is not None and second.id == first.id and second.claims == 2 and second.token != first.token
    with transaction(db) as session:
        assert not queue_repo.renew(session, first, 60)
        assert not queue_repo.finish(session, first, "a", 0, None, [{"from": "a"}], {})
        assert queue_repo.finish(session, second, "b", 0, None, [{"from": "b"}], {})
    with transaction(db) as session:
        assert not queue_repo.finish(session, second, "b", 0, None, [{"again": True}], {})  # done: once
        done = queue_repo.finished(session, run_id, 1)
        assert done is not None and done.groups == [{"from": "b"}] and done.claims == 2
        assert queue_repo.state(session, run_id, 1).redone == 1
        queue_repo.mark(session, done.id, "used")
        assert queue_repo.finished(session, run_id, 1) is None
    with db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM rollout_results")).scalar() == 1


def test_a_dropped_step_is_queued_again_as_its_next_attempt(db: Engine, run_id: int) -> None:
    _enqueue(db, run_id, range(1, 2))
    with transaction(db) as session:
        claim = queue_repo.claim(session, run_id, "a", lease_s=60)
        assert claim is not None and queue_repo.finish(session, claim, "a", 0, None, [], {})
        done = queue_repo.finished(session, run_id, 1)
        assert done is not None
        queue_repo.mark(session, done.id, "dropped")
        assert queue_repo.live_steps(session, run_id, 1, 5) == set()
        assert queue_repo.enqueue(session, run_id, 1, done.prompts, 1) is not None
        again = queue_repo.claim(session, run_id, "a", lease_s=60)
    assert again is not None and again.attempt == 1 and again.min_policy_step == 1 and again.claims == 1


def test_runs_workers_shows_what_each_worker_holds_and_finished(db: Engine, run_id: int, run_cli: Callable) -> None:
    _enqueue(db, run_id, range(1, 4))
    with transaction(db) as session:
        one = queue_repo.claim(session, run_id, "worker a", lease_s=60)
        assert one is not None and queue_repo.finish(session, one, "worker a", 0, None, [], {})
        assert queue_repo.claim(session, run_id, "worker a", lease_s=60) is not None  # holds step 2
        assert queue_repo.claim(session, run_id, "worker b", lease_s=0.2) is not None  # step 3, soon lapsed
    time.sleep(0.4)
    with transaction(db) as session:
        a, b = queue_repo.workers(session)
        assert queue_repo.workers(session, ["no such run"]) == []
    assert (a.run, a.worker, a.holding, a.finished) == ("queued", "worker a", 2, 1)
    assert a.lease_left_s is not None and 50 < a.lease_left_s <= 60 and a.last_finished_age_s is not None
    assert (b.worker, b.holding, b.finished, b.last_finished_age_s) == ("worker b", 3, 0, None)
    assert b.lease_left_s is not None and b.lease_left_s < 0  # lapsed: the next claim redoes step 3

    out = run_cli("runs", "workers", "queued").out.splitlines()
    assert out[0].split() == ["run", "worker", "holds", "lease", "finished", "last", "finished"]
    held = out[1].split()
    assert held[:4] == ["queued", "worker", "a", "2"] and held[5] == "1" and held[6].endswith("s")
    assert held[4].endswith("s") and 50 < int(held[4][:-1]) <= 60  # the lease's seconds left
    assert out[2].split()[:6] == ["queued", "worker", "b", "3", "lapsed", "0"]
    missing = run_cli("runs", "workers", "nope")
    assert missing.code == 2 and "no run named 'nope'" in missing.err and "hint:" in missing.err
