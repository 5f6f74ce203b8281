"""Repositories against the real database: problems, runs, rollout groups, experiences and bad input."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import group, make_attempts, make_pool, make_problems

from lanpo.db.repo import attempts as attempts_repo
from lanpo.db.repo import experiences as exp_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup
from lanpo.db.repo.checks import MAX_TEXT_BYTES
from lanpo.db.repo.experiences import NewExperience
from lanpo.db.repo.problems import Question
from lanpo.errors import InputError


def test_upsert_is_idempotent_and_refuses_changes_unless_update(session: Session) -> None:
    rows = [Question("1", "2+2?", "4", {"t": "x"}), Question("2", "3+3?", "6")]
    first = problems_repo.upsert_problems(session, "ds", rows)
    assert (first.inserted, first.unchanged, first.refused) == (2, 0, [])
    again = problems_repo.upsert_problems(session, "ds", rows)
    assert (again.inserted, again.unchanged, again.refused) == (0, 2, [])
    changed = [Question("1", "2+2=?", "4", {"t": "x"}), Question("3", "1+1?", "2")]
    refused = problems_repo.upsert_problems(session, "ds", changed)
    assert (refused.inserted, refused.refused) == (1, ["1"])
    assert problems_repo.get_problem(session, "ds", "1").question == "2+2?"
    updated = problems_repo.upsert_problems(session, "ds", changed, update=True)
    assert (updated.updated, updated.unchanged) == (1, 1)
    assert problems_repo.get_problem(session, "ds", "1").question == "2+2=?"
    assert len(problems_repo.problem_ids(session, "ds")) == 3


def test_problem_lookup_errors_name_the_fix(session: Session) -> None:
    ids = make_problems(session, 2, dataset="known")
    with pytest.raises(InputError, match="unknown dataset 'nope'") as err:
        problems_repo.problem_ids(session, "nope")
    assert "known" in (err.value.hint or "")
    with pytest.raises(InputError, match="unknown dataset"):
        problems_repo.get_problem(session, "nope", "1")
    with pytest.raises(InputError, match="no problem '99' in dataset 'known'"):
        problems_repo.get_problem(session, "known", "99")
    with pytest.raises(InputError, match="unknown problem id: 12345"):
        problems_repo.problems_by_ids(session, [ids[0], 12345])
    assert problems_repo.resolve_refs(session, ["known:1", str(ids[0])]) == [ids[1], ids[0]]
    with pytest.raises(InputError, match="neither"):
        problems_repo.resolve_refs(session, ["abc"])


def test_problem_bad_input(session: Session) -> None:
    with pytest.raises(InputError, match="NUL byte"):
        problems_repo.upsert_problems(session, "ds", [Question("1", "a\x00b", "1")])
    with pytest.raises(InputError, match="1,048,576 bytes"):
        problems_repo.upsert_problems(session, "ds", [Question("1", "x" * (MAX_TEXT_BYTES + 1), "1")])
    with pytest.raises(InputError, match="metadata must be a JSON object"):
        problems_repo.upsert_problems(session, "ds", [Question("1", "q", "1", ["not", "a", "dict"])])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="not JSON-serialisable"):
        problems_repo.upsert_problems(session, "ds", [Question("1", "q", "1", {"s": {1, 2}})])
    with pytest.raises(InputError, match="appears twice"):
        problems_repo.upsert_problems(session, "ds", [Question("1", "q"), Question("1", "q")])
    assert session.scalar(sa.text("SELECT count(*) FROM problems")) == 0


def test_runs_steps_metrics_and_rollback(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    pool = make_pool(session)
    run = runs_repo.create_run(session, "r1", "train", {"lr": 1e-5}, "smollm2", pool_id=pool.id)
    with pytest.raises(InputError, match="already exists"):
        runs_repo.create_run(session, "r1", "train", {})
    with pytest.raises(InputError, match="JSON object"):
        runs_repo.create_run(session, "r2", "train", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="kind"):
        runs_repo.create_run(session, "r3", "party", {})
    assert runs_repo.get_run(session, "r1").id == run.id
    sha = "ab" * 32
    for step in range(3):
        pv = steps_repo.add_policy_version(session, run.id, step, sha)
        assert steps_repo.add_policy_version(session, run.id, step, sha) == pv
        (ids,) = attempts_repo.record_groups(session, [group(pid, ["r", "r"], step=step, run_id=run.id)])
        if step:  # a later group carries an earlier step's attempt as context (rolled back together with it)
            attempts_repo.record_groups(
                session, [group(pid, ["r"], "intra", step=step, run_id=run.id, contexts=[ContextRef(0, None, ids[0])])]
            )
        exp_repo.add_experiences(
            session, pool, [NewExperience(pid, f"s{step}", 1.0, source_attempt_id=ids[0], run_id=run.id, step=step)]
        )
        runs_repo.record_metrics(session, run.id, step, {"loss": 0.5, "reward": 1})
        if step < 2:
            steps_repo.commit_step(session, run.id, step, pv, f"ckpt-{step}")
    with pytest.raises(InputError, match="already recorded with adapter"):
        steps_repo.add_policy_version(session, run.id, 0, "cd" * 32)
    assert steps_repo.last_committed_step(session, run.id) == 1
    result = steps_repo.rollback_uncommitted(session, run.id, 1)
    assert (result.groups, result.experiences, result.metrics, result.policy_versions) == (2, 1, 2, 1)
    assert session.scalar(sa.text("SELECT max(step) FROM rollout_groups")) == 1
    assert session.scalar(sa.text("SELECT count(*) FROM attempts")) == 5  # 2 + (2 + 1) of steps 0 and 1
    with pytest.raises(InputError, match="already committed"):
        steps_repo.commit_step(session, run.id, 1)
    runs_repo.finish_run(session, run.id, "finished")
    assert session.scalar(sa.text("SELECT finished_at IS NOT NULL FROM runs")) is True
    with pytest.raises(InputError, match="number"):
        runs_repo.record_metrics(session, run.id, 5, {"x": "high"})  # type: ignore[dict-item]


def test_record_groups_with_contexts(session: Session) -> None:
    pids = make_problems(session, 2)
    earlier = make_attempts(session, pids[0], 2)
    version = exp_repo.add_experiences(
        session, make_pool(session), [NewExperience(pids[1], "lesson", 1.0)]
    ).version_ids[0]
    ids = attempts_repo.record_groups(
        session,
        [
            group(pids[0], ["r", "r1"], "intra", "pi", 0.0, [ContextRef(0, context_attempt_id=earlier[0])]),
            group(pids[0], ["r2"], "zero_shot", "pz", 1.0),
            group(pids[0], ["r3", "r4", "r5"], "inter", "px", 1.0, [ContextRef(0, version, score=0.9)]),
        ],
    )
    assert [len(g) for g in ids] == [2, 1, 3]
    flat = [i for g in ids for i in g]
    assert flat == sorted(flat) and len(set(flat)) == 6
    rows = session.execute(
        sa.text(
            "SELECT a.id, g.prompt, c.experience_version_id, c.context_attempt_id FROM attempts a "
            "JOIN rollout_groups g ON g.id = a.group_id LEFT JOIN group_contexts c ON c.group_id = g.id "
            "WHERE a.id = ANY(:ids) ORDER BY a.id"
        ),
        {"ids": flat},
    ).all()
    assert [tuple(r) for r in rows] == [
        (flat[0], "pi", None, earlier[0]),
        (flat[1], "pi", None, earlier[0]),
        (flat[2], "pz", None, None),
        (flat[3], "px", version, None),
        (flat[4], "px", version, None),
        (flat[5], "px", version, None),
    ]
    # the prompt is stored once per group, the context once per group and item
    assert session.scalar(sa.text("SELECT count(*) FROM rollout_groups WHERE prompt IN ('pi', 'pz', 'px')")) == 3
    assert session.scalar(sa.text("SELECT count(*) FROM group_contexts")) == 2
    assert session.scalar(sa.text("SELECT response FROM attempts WHERE id = :i"), {"i": flat[2]}) == "r2"


def test_attempt_bad_input(session: Session, caplog: pytest.LogCaptureFixture) -> None:
    pid = make_problems(session, 1)[0]
    session.commit()
    with caplog.at_level(logging.WARNING):
        ((aid,),) = attempts_repo.record_groups(session, [group(pid, ["a\x00b"])])
    assert session.scalar(sa.text("SELECT response FROM attempts WHERE id = :i"), {"i": aid}) == "ab"
    assert "NUL" in caplog.text and "stripped" in caplog.text
    bad = {
        "mode": group(pid, ["r"], "telepathy"),
        "finite": group(pid, ["r"], reward=float("nan")),
        "bytes; the limit": group(pid, ["x" * (MAX_TEXT_BYTES + 1)]),
        "exactly one": group(pid, ["r"], "intra", contexts=[ContextRef(0)]),
        "distinct": group(pid, ["r"], "inter", contexts=[ContextRef(0, 1), ContextRef(0, 2)]),
        "at least one attempt": NewGroup(pid, "zero_shot", "p", []),
        "64 lowercase hex": NewGroup(pid, "zero_shot", "p", [NewAttempt("r", served_adapter_sha256="abc")]),
        "must be a number": NewGroup(pid, "zero_shot", "p", [NewAttempt("r", "1.0")]),  # type: ignore[arg-type]
        r"cannot record rollout groups: .*99999": group(99999, ["r"]),
    }
    for message, g in bad.items():
        with pytest.raises(InputError, match=message):
            attempts_repo.record_groups(session, [group(pid, ["fine"]), g])
        session.rollback()
    assert session.scalar(sa.text("SELECT count(*) FROM attempts")) == 0  # nothing half-written


def test_experience_versions(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    added = exp_repo.add_experiences(session, make_pool(session), [NewExperience(pid, "v1 text", 0.5, author="m")])
    eid = added.experience_ids[0]
    v2 = exp_repo.append_version(session, eid, "v2 text", author="m2")
    v3 = exp_repo.append_version(session, eid, "v3 text")
    assert exp_repo.current_versions(session, [eid])[eid].id == v3
    history = exp_repo.all_versions(session, eid)
    assert [(v.version, v.summary) for v in history] == [(1, "v1 text"), (2, "v2 text"), (3, "v3 text")]
    assert history[1].id == v2
    with pytest.raises(InputError, match="no experience"):
        exp_repo.append_version(session, 424242, "x")
    with pytest.raises(InputError, match="no experience"):
        exp_repo.all_versions(session, 424242)


def test_wrong_vector_dimension_names_both(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    dim = session.scalar(
        sa.text(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'experience_versions'::regclass "
            "AND attname = 'embedding'"
        )
    )
    pool = make_pool(session)
    with pytest.raises(InputError, match=rf"has 3 dimensions but experience_versions.embedding is vector\({dim}\)"):
        exp_repo.add_experiences(session, pool, [NewExperience(pid, "s", embedding=[0.1, 0.2, 0.3])])
    ok = exp_repo.add_experiences(session, pool, [NewExperience(pid, "s", embedding=[0.5] * dim)])
    assert (
        session.scalar(
            sa.text("SELECT vector_dims(embedding) FROM experience_versions WHERE id = :i"), {"i": ok.version_ids[0]}
        )
        == dim
    )
    with pytest.raises(InputError, match="dimensions"):
        exp_repo.append_version(session, ok.experience_ids[0], "t", embedding=[1.0])


def test_experience_bad_input(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    pool = make_pool(session)
    with pytest.raises(InputError, match="unknown problem id: 777"):
        exp_repo.add_experiences(session, pool, [NewExperience(777, "s")])
    with pytest.raises(InputError, match="kind"):
        exp_repo.add_experiences(session, pool, [NewExperience(pid, "s", kind="gossip")])
    with pytest.raises(InputError, match="empty"):
        exp_repo.add_experiences(session, pool, [NewExperience(pid, "  ")])
    with pytest.raises(InputError, match="must be a string"):
        exp_repo.add_experiences(session, pool, [NewExperience(pid, 42)])  # type: ignore[arg-type]


def test_text_round_trips_exactly_through_copy(session: Session) -> None:
    pid = make_problems(session, 1)[0]
    tricky = "tab\there\nnew line \\ backslash \\N not null, unicode: ∑ x² — 数学, \r\n end"
    eid = exp_repo.add_experiences(
        session, make_pool(session), [NewExperience(pid, tricky, author="a\tb")]
    ).experience_ids[0]
    ((aid,),) = attempts_repo.record_groups(session, [group(pid, [tricky], prompt=tricky)])
    assert exp_repo.current_versions(session, [eid])[eid].summary == tricky
    assert exp_repo.current_versions(session, [eid])[eid].author == "a\tb"
    row = session.execute(
        sa.text(
            "SELECT g.prompt, a.response FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE a.id = :i"
        ),
        {"i": aid},
    ).one()
    assert tuple(row) == (tricky, tricky)


def test_two_writers_of_one_dataset_take_turns(db) -> None:  # type: ignore[no-untyped-def]
    """Two processes that generate the same dataset at once (two runs of an experiment creating their validation
    set) both succeed: the second waits for the first's transaction, then finds its rows unchanged. Without the
    dataset's lock the second insert blocks on the first's uncommitted keys and then fails on the unique index."""
    import threading

    rows = [Question(f"p{i}", f"What is {i} + 1?", str(i + 1)) for i in range(48)]
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            with Session(db) as s2, s2.begin():
                outcome["result"] = problems_repo.upsert_problems(s2, "shared-val", rows)
        except Exception as exc:  # the failure the lock prevents: UniqueViolation
            outcome["error"] = exc

    with Session(db) as s1:
        with s1.begin():
            first = problems_repo.upsert_problems(s1, "shared-val", rows)
            thread = threading.Thread(target=second)
            thread.start()
            thread.join(timeout=1.0)
            assert thread.is_alive(), "the second writer must wait for the first's transaction"
        thread.join(timeout=30)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert first.inserted == 48
    assert outcome["result"].inserted == 0 and outcome["result"].unchanged == 48  # type: ignore[attr-defined]
    with Session(db) as s:
        assert len(problems_repo.problem_ids(s, "shared-val")) == 48
