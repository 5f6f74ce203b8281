"""What a trainer decides about its groups after writing them (`lifecycle.consume_groups`, migration 0023), as verl's
asynchronous modes decide it: a group trained steps after the one that dispatched it, or dropped with a reason; each
response's first and last weights under partial rollout; a resume that undoes the fates decided after its
checkpoint, and a group re-issued under its name replacing what the killed run wrote of it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import InputError
from lanpo.feedback import DataConfig, FeedbackConfig, StepPrompts, StoreClient, StoreRunConfig, lifecycle
from lanpo.feedback import record as rows
from lanpo.rollout import Completion

QUESTIONS = {"1": ("1 + 1?", "2"), "2": ("2 + 2?", "4"), "3": ("3 + 3?", "6")}


@pytest.fixture
def life(db: Engine) -> tuple[StoreClient, lifecycle.Run]:
    with transaction(db) as session:
        upsert_problems(session, "fates", [Question(i, q, a) for i, (q, a) in QUESTIONS.items()])
    config = StoreRunConfig(run_name="fates", data=DataConfig(dataset="fates"), feedback=FeedbackConfig(mode="none"))
    client = StoreClient(config, db)
    return client, client.open("tiny-random")


def _write(
    client: StoreClient,
    run: lifecycle.Run,
    step: int,
    uid: str,
    segments: tuple[int | None, int | None] = (None, None),
    lesson: str | None = None,
) -> None:
    """One group of two rollouts, named `uid`, at `step` (its version: the weights after step - 1)."""
    version = run.add_policy_version(step - 1, f"{step - 1:064x}")
    pid = client.problem_ids[int(uid[-1]) % len(client.problem_ids)]
    question = "q"
    prompts = StepPrompts([pid], [question], ["?"], ["zero_shot"], ["zero_shot"], [question], [[]], version)
    group = [Completion(text, (1,), (2,), "stop") for text in (r"\boxed{2}", r"\boxed{0}")]
    [record] = rows.group_records(prompts, [group], client.grade(prompts, [group]), {})
    record.trainer_uid = uid
    first, last = (run.add_policy_version(s, f"{s:064x}") if s is not None else None for s in segments)
    for rollout in record.rollouts:
        rollout.first_policy_version_id, rollout.last_policy_version_id = first, last
    if lesson is not None:
        record.rollouts[0].summary = lesson
    run.write_groups(step, [record], version)


def _groups(db: Engine) -> dict[str, tuple]:
    """trainer_uid -> (step, consumed_step, dropped)."""
    with db.connect() as conn:
        found = conn.execute(sa.text("SELECT trainer_uid, step, consumed_step, dropped FROM rollout_groups")).all()
    return {r.trainer_uid: (r.step, r.consumed_step, r.dropped) for r in found}


def test_each_group_trains_or_is_dropped_once_at_the_step_that_took_it(
    db: Engine, life: tuple[StoreClient, lifecycle.Run]
) -> None:
    client, run = life
    for uid in ("g1", "g2", "g3"):
        _write(client, run, 1, uid)
    done = run.consume(1, ["g1"], {})
    assert (done.trained, done.dropped, done.missing) == (1, {}, ())
    done = run.consume(2, ["g2"], {"g3": "stale", "never": "failed"})  # a failed group that wrote nothing
    assert (done.trained, done.dropped, done.missing) == (1, {"stale": 1}, ("never",))
    again = run.consume(3, ["g1"], {})  # consumed before: its first fate stands
    assert (again.trained, again.again) == (0, ("g1",))
    assert _groups(db) == {"g1": (1, 1, None), "g2": (1, 2, None), "g3": (1, 2, "stale")}


@pytest.mark.parametrize(
    ("trained", "dropped", "message"),
    [
        ([], {"g1": "bored"}, "unknown drop reason 'bored'"),
        (["g1"], {"g1": "stale"}, "group 'g1' is both trained and dropped at step 1"),
    ],
)
def test_a_bad_consumption_is_refused_and_writes_nothing(
    db: Engine, life: tuple[StoreClient, lifecycle.Run], trained: list[str], dropped: dict[str, str], message: str
) -> None:
    client, run = life
    _write(client, run, 1, "g1")
    with pytest.raises(InputError, match=message):
        run.consume(1, trained, dropped)
    assert _groups(db) == {"g1": (1, None, None)}


def test_the_weights_of_a_responses_segments_are_kept(db: Engine, life: tuple[StoreClient, lifecycle.Run]) -> None:
    client, run = life
    _write(client, run, 1, "g1", segments=(0, 2))  # partial rollout: begun after step 0's weights, ended after 2's
    _write(client, run, 1, "g2")
    with db.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT g.trainer_uid, f.step AS first, l.step AS last FROM attempts a "
                "JOIN rollout_groups g ON g.id = a.group_id "
                "LEFT JOIN policy_versions f ON f.id = a.first_policy_version_id "
                "LEFT JOIN policy_versions l ON l.id = a.last_policy_version_id ORDER BY a.id"
            )
        ).all()
    assert [tuple(r) for r in found] == [("g1", 0, 2), ("g1", 0, 2), ("g2", None, None), ("g2", None, None)]


def test_a_resume_undoes_later_fates_and_a_reissued_group_replaces_the_killed_runs_row(
    db: Engine, life: tuple[StoreClient, lifecycle.Run]
) -> None:
    client, run = life
    _write(client, run, 1, "g1")
    _write(client, run, 1, "g2", segments=(0, 2), lesson="Add the two numbers, then check the sum.")
    run.consume(1, ["g1"], {})
    run.commit_written(before=2)
    assert run.name_checkpoint(1, "/ckpt/1")
    _write(client, run, 2, "g3")  # after the checkpoint: the killed run's
    run.consume(2, ["g2", "g3"], {})
    run.commit_written(before=3)

    rolled = run.roll_back_after(1)  # verl resumes from its checkpoint of step 1
    assert (rolled.groups, rolled.fates, rolled.steps) == (1, 1, 1)
    assert _groups(db) == {"g1": (1, 1, None), "g2": (1, None, None)}  # g2 is in verl's restored buffer again

    with db.connect() as conn:
        versions = conn.scalars(sa.text("SELECT step FROM policy_versions ORDER BY step")).all()
    assert versions == [0, 1, 2]  # g2's responses, kept, name the weights after step 2
    assert _lessons(db) == 1

    # ... or was in flight at the checkpoint: verl re-issues it under its uid, and the row the killed run wrote of it
    # after the checkpoint goes at the dispatch, with its lesson, before any draw can read it
    assert run.redispatch(["g2", "fresh"]) == 1
    assert _groups(db) == {"g1": (1, 1, None)} and _lessons(db) == 0
    _write(client, run, 2, "g2")
    _write(client, run, 2, "g2")  # written twice under one name (a writer's retry): the second replaces the first
    assert _groups(db) == {"g1": (1, 1, None), "g2": (2, None, None)}


def _lessons(db: Engine) -> int:
    with db.connect() as conn:
        return int(conn.scalar(sa.text("SELECT count(*) FROM experiences")))
