"""A run's life through the store API (`lanpo.feedback.lifecycle`): two real processes opening one run name at
once (exactly one creates it; the other resumes it, or is refused with one `error:` line), and a resume after a
kill (the rows after the last checkpointed step rolled back, the step to continue from said)."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import ConfigError, LanpoError
from lanpo.feedback import DataConfig, FeedbackConfig, StepPrompts, StoreClient, StoreRunConfig, lifecycle
from lanpo.rollout import Completion

HOLD_S = 0.6  # how long the first opener holds the name's lock after its open: the second waits it out


def _open_at_once(url: str, resume: bool, ready: Any, out: Any) -> None:
    """One process: connect, wait for the other at the barrier, open the run, hold the transaction HOLD_S."""
    db = sa.create_engine(url, poolclass=sa.pool.NullPool)
    spec = lifecycle.RunSpec("race", "tiny-random", "race", StoreConfig(), {"trainer": "api"}, "api")
    with db.connect():  # connected before the barrier: the race starts at the open
        pass
    ready.wait(timeout=30)
    began = time.monotonic()
    try:
        with transaction(db) as session:
            opened = lifecycle.open_run(session, spec, resume=resume)
            waited = time.monotonic() - began
            time.sleep(HOLD_S)  # the lock is held to the commit
        out.put(("opened", opened.run_id, opened.created, waited))
    except LanpoError as exc:
        out.put(("refused", type(exc).__name__, f"error: {exc.message}", time.monotonic() - began))
    except BaseException as exc:  # the race lost badly (a unique-name violation): reported, not raised
        out.put(("crashed", type(exc).__name__, str(exc).splitlines()[0], time.monotonic() - began))
    finally:
        db.dispose()


def _race(db: Engine, resume: bool) -> list[tuple]:
    fork = multiprocessing.get_context("fork")
    ready, out = fork.Barrier(2), fork.Queue()
    url = db.url.render_as_string(hide_password=False)
    procs = [fork.Process(target=_open_at_once, args=(url, resume, ready, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sorted(got, key=lambda r: r[-1])  # the first to get the lock first


@pytest.mark.parametrize("resume", [False, True])
def test_two_processes_opening_one_run_at_once_create_it_once(db: Engine, resume: bool) -> None:
    first, second = _race(db, resume)
    assert first[:1] == ("opened",) and first[2] is True  # exactly one creates it
    assert second[-1] >= HOLD_S * 0.8  # the other waited for the first's commit (the race happened)
    if resume:
        assert second[:3] == ("opened", first[1], False)  # ... and resumed the run the first created
    else:
        kind, name, line, _ = second
        assert (kind, name) == ("refused", "ConfigError") and line == "error: a run named 'race' already exists"
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM runs WHERE name = 'race'")) == 1
        assert conn.scalar(sa.text("SELECT count(*) FROM pools WHERE name = 'race'")) == 1


def _group(answer: str) -> list[Completion]:
    return [Completion(text, (1,), (2,), "stop") for text in (rf"\boxed{{{answer}}}", r"\boxed{0}")]


def test_a_reopened_run_rolls_back_after_its_last_checkpoint_and_says_where_to_continue(db: Engine) -> None:
    with transaction(db) as session:
        upsert_problems(session, "life", [Question(external_id="1", question="1 + 1?", answer="2")])
    config = StoreRunConfig(run_name="life", data=DataConfig(dataset="life"), feedback=FeedbackConfig(mode="none"))
    client = StoreClient(config, db)
    run = client.open("tiny-random")
    assert run.opened.created and run.next_step == 1

    def write(step: int) -> None:
        version = run.add_policy_version(step - 1, f"{step - 1:064x}")
        prompts = StepPrompts(
            client.problem_ids, ["1 + 1?"], ["2"], ["zero_shot"], ["zero_shot"], ["1 + 1?"], [[]], version
        )
        client.write(run, step, prompts, [_group("2")], client.grade(prompts, [_group("2")]))

    for step in (1, 2, 3):
        write(step)
        client.commit(run, step, checkpoint="/ckpt/1" if step == 1 else None)
    assert run.name_checkpoint(3, "/ckpt/3")  # a checkpoint that follows its step's commit
    write(4)  # ... then the process is killed: step 4's groups are written, never committed
    with pytest.raises(ConfigError, match="already exists"):
        client.open("tiny-random")  # not without resume=True

    again = client.open("tiny-random", resume=True)
    assert (again.run_id, again.opened.created, again.next_step, again.opened.checkpoint) == (
        run.run_id,
        False,
        4,
        "/ckpt/3",
    )
    assert again.opened.rolled_back is not None and again.opened.rolled_back.groups == 1
    with db.connect() as conn:
        groups = conn.execute(sa.text("SELECT step, count(*) FROM rollout_groups GROUP BY step ORDER BY step")).all()
        steps = conn.execute(sa.text("SELECT step, checkpoint FROM run_steps ORDER BY step")).all()
        reward = conn.scalar(sa.text("SELECT value FROM run_metrics WHERE step = 3 AND name = 'accuracy/mean'"))
    assert groups == [(1, 1), (2, 1), (3, 1)] and steps == [(1, "/ckpt/1"), (2, None), (3, "/ckpt/3")]
    assert reward == 0.5  # the step's metrics, read back from its rows at the commit
