"""Replay's store side (migration 0017, lanpo.db.repo.trajectories): tokens written and checked, the candidates and the
latest correctness a draw reads, replayed groups written as replays, kept out of fresh-rollout views, listed by the
`replays` view, removed by a resume's rollback and by a downgrade."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from store_helpers import make_problems

from lanpo.db import migrate
from lanpo.db.readonly import query_readonly
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import trajectories as replay
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.steps import rollback_uncommitted
from lanpo.errors import InputError


def _step(session: Session, run: int, step: int, groups: list[tuple[int, str, list[bool | None]]]) -> list[int]:
    """One step's groups (problem, mode, correctness per attempt) as training writes them: consecutive attempt
    ids, tokens stored for every attempt; returns the attempt ids in order."""
    new = [
        NewGroup(p, mode, f"question {p}", [NewAttempt(f"r{p}.{step}.{j}", None if c is None else float(c), c,
                                                       True, 3) for j, c in enumerate(cs)],
                 "actor-v1", 7, step, run)
        for p, mode, cs in groups
    ]  # fmt: skip
    ids = [a for g in record_groups(session, new) for a in g]
    replay.write_tokens(session, [(a, [1, 2, 3], [-0.5, -0.25, -1.0], "engine") for a in ids])
    return ids


def test_write_tokens_round_trip_and_checks(session: Session) -> None:
    (p,) = make_problems(session, 1)
    run = runs_repo.create_run(session, "r", "train", {}).id
    (a, b) = [x for g in record_groups(session, [NewGroup(p, "zero_shot", "q", [NewAttempt("x"), NewAttempt("y")],
                                                          step=1, run_id=run)]) for x in g]  # fmt: skip
    assert replay.write_tokens(session, [(a, [5, 0, 9], [-0.1, -2.5, 0.0], "trainer")]) == 1
    row = session.execute(sa.text("SELECT token_ids, logprobs, logprobs_of FROM attempt_tokens")).one()
    assert (row.token_ids, row.logprobs, row.logprobs_of) == ([5, 0, 9], [pytest.approx(-0.1), -2.5, 0.0], "trainer")
    for bad in (
        (b, [1, 2], [-0.1], "engine"),  # lengths differ
        (b, [], [], "engine"),  # empty
        (b, [1], [float("nan")], "engine"),
        (b, [1], [-0.1], "vllm"),
        (b, [-1], [-0.1], "engine"),
    ):
        with pytest.raises(InputError):
            replay.write_tokens(session, [(b, [1], [-0.2], "engine"), bad])  # the good first row is not written
        assert session.scalar(sa.text("SELECT count(*) FROM attempt_tokens")) == 1
    with pytest.raises(InputError, match="attempt tokens"):
        replay.write_tokens(session, [(10**9, [1], [-0.2], "engine")])  # no such attempt


def test_schema_checks_lengths(session: Session) -> None:
    (p,) = make_problems(session, 1)
    (a,) = record_groups(session, [NewGroup(p, "zero_shot", "q", [NewAttempt("x")])])[0]
    with pytest.raises(sa.exc.IntegrityError, match="lengths_match"):
        session.execute(sa.text(f"INSERT INTO attempt_tokens VALUES ({a}, '{{1,2}}', '{{-1}}', 'engine')"))


def _store(session: Session) -> dict[str, object]:
    """Two runs on problems p, q, s: zero_shot, intra and inter groups over steps 1..3, one replay at step 3."""
    p, q, s = make_problems(session, 3)
    run = runs_repo.create_run(session, "live", "train", {}).id
    other = runs_repo.create_run(session, "other", "train", {}).id
    ids = {
        1: _step(session, run, 1, [(p, "zero_shot", [True, False]), (q, "zero_shot", [False, False]),
                                   (p, "intra", [True, True])]),
        2: _step(session, run, 2, [(p, "zero_shot", [True, None]), (q, "inter", [True, False]),
                                   (s, "zero_shot", [True])]),
        3: _step(session, run, 3, [(p, "zero_shot", [False]), (q, "zero_shot", [True])]),
        "other": _step(session, other, 1, [(p, "zero_shot", [True])]),
    }  # fmt: skip
    no_tokens = record_groups(session, [NewGroup(p, "zero_shot", "q", [NewAttempt("n", 1.0, True)], step=1,
                                                 run_id=run)])[0]  # fmt: skip
    return {"p": p, "q": q, "s": s, "run": run, "other": other, "ids": ids, "no_tokens": no_tokens}


def test_candidates_are_graded_zero_shot_attempts_with_tokens_before_the_step(session: Session) -> None:
    st = _store(session)
    p, q, s, run, ids = st["p"], st["q"], st["s"], st["run"], st["ids"]
    got = replay.candidates(session, [run], [p, q, s], before_step=3, successes_only=True)
    # p: step 1's correct zero_shot (not intra, not the one without tokens), step 2's correct (the ungraded one no)
    assert {k: [c.attempt_id for c in v] for k, v in got.items()} == {p: [ids[1][0], ids[2][0]], s: [ids[2][4]]}
    c = got[p][0]
    assert (c.run_id, c.step, c.prompt, c.prompt_version, c.prompt_tokens) == (run, 1, f"question {p}", "actor-v1", 7)
    assert (c.response, c.reward, c.correct, c.format_ok, c.completion_tokens) == (f"r{p}.1.0", 1.0, True, True, 3)
    assert (c.token_ids, c.logprobs, c.logprobs_of) == ([1, 2, 3], [-0.5, -0.25, -1.0], "engine")
    every = replay.candidates(session, [run], [p, q], before_step=3, successes_only=False)
    assert [c.attempt_id for c in every[q]] == ids[1][2:4]  # the failures too; q's inter group never
    assert [c.attempt_id for c in every[p]] == [ids[1][0], ids[1][1], ids[2][0]]
    both = replay.candidates(session, [run, st["other"]], [p], before_step=2, successes_only=True)
    assert [c.attempt_id for c in both[p]] == [ids[1][0], ids["other"][0]]  # by step, then id
    # a replayed copy is never a candidate (its group is not zero_shot, and it names a source)
    replay.record_replays(session, run, 3, None, [_Draw(p, got[p][:1])])
    again = replay.candidates(session, [run], [p], before_step=4, successes_only=True)
    assert [c.attempt_id for c in again[p]] == [ids[1][0], ids[2][0]]


@dataclass
class _Draw:
    problem_id: int
    candidates: list[replay.Candidate]


def test_latest_correctness_reads_fresh_attempts_at_the_latest_step(session: Session) -> None:
    st = _store(session)
    p, q, s, run = st["p"], st["q"], st["s"], st["run"]
    got = replay.latest_correctness(session, [run], [p, q, s], before_step=3)
    # p at step 2: one correct, one ungraded (left out) -> 1.0; q at step 2 (inter): 1/2; s at step 2: 1.0
    assert got == {p: 1.0, q: 0.5, s: 1.0}
    # p at step 1: zero_shot 1/2, intra 2/2, the attempt without tokens 1/1 -> 4/5
    assert replay.latest_correctness(session, [run], [p, q], before_step=2) == {p: 0.8, q: 0.0}
    # replays at step 3 (all correct copies) do not move p's latest correctness (step 3: one wrong attempt)
    cands = replay.candidates(session, [run], [p], before_step=3, successes_only=True)
    replay.record_replays(session, run, 3, None, [_Draw(p, cands[p])])
    assert replay.latest_correctness(session, [run], [p], before_step=4) == {p: 0.0}


def test_record_replays_writes_replays_kept_out_of_fresh_views(session: Session) -> None:
    st = _store(session)
    p, s, run, ids = st["p"], st["s"], st["run"], st["ids"]
    cands = replay.candidates(session, [run, st["other"]], [p, s], before_step=3, successes_only=True)
    before = session.execute(sa.text("SELECT * FROM run_rewards WHERE step = 3 ORDER BY mode")).all()
    assert [c.run_id for c in cands[p]] == [run, st["other"], run]  # by step: 1, 1, 2
    draws = [_Draw(p, [cands[p][2], cands[p][1]]), _Draw(s, cands[s])]
    written = replay.record_replays(session, run, 3, None, draws)
    assert [len(w) for w in written] == [2, 1]
    rows = session.execute(
        sa.text(
            "SELECT a.id, a.replay_of, a.response, a.reward, a.correct, a.format_ok, a.completion_tokens, g.mode, "
            "g.step, g.run_id, g.prompt, g.prompt_version, g.prompt_tokens FROM attempts a "
            "JOIN rollout_groups g ON g.id = a.group_id WHERE a.replay_of IS NOT NULL ORDER BY a.id"
        )
    ).all()
    assert sorted(r.replay_of for r in rows) == sorted([ids[2][0], ids["other"][0], ids[2][4]])
    assert {r.id: r.replay_of for r in rows} == dict(zip(
        [a for w in written for a in w], [cands[p][2].attempt_id, cands[p][1].attempt_id, cands[s][0].attempt_id],
        strict=True))  # fmt: skip
    for r in rows:
        src = session.execute(sa.text("SELECT response, reward FROM attempts WHERE id = :i"), {"i": r.replay_of}).one()
        assert (r.response, r.reward, r.correct, r.mode, r.step, r.run_id) == (*src, True, "replayed", 3, run)
        assert (r.format_ok, r.completion_tokens, r.prompt_version, r.prompt_tokens) == (True, 3, "actor-v1", 7)
    # the same prompt for p's two sources: one group per problem
    assert session.scalar(sa.text("SELECT count(*) FROM rollout_groups WHERE mode = 'replayed'")) == 2
    after = session.execute(sa.text("SELECT * FROM run_rewards WHERE step = 3 ORDER BY mode")).all()
    assert after == before  # no reward or accuracy curve moves
    view = session.execute(
        sa.text("SELECT attempt_id, source_attempt_id, source_run_name, source_step, age, correct, logprobs_of "
                "FROM replays ORDER BY attempt_id")
    ).all()  # fmt: skip
    assert [(v.source_attempt_id, v.source_run_name, v.source_step, v.age) for v in view] == [
        (cands[p][2].attempt_id, "live", 2, 1), (cands[p][1].attempt_id, "other", 1, 2),
        (cands[s][0].attempt_id, "live", 2, 1),
    ]  # fmt: skip
    with pytest.raises(InputError, match="twice"):
        replay.record_replays(session, run, 3, None, [_Draw(p, [cands[p][0], cands[p][0]])])
    with pytest.raises(InputError, match="problem"):
        replay.record_replays(session, run, 3, None, [_Draw(s, cands[p][:1])])


def test_rollback_removes_a_steps_replays_and_a_deleted_source_leaves_none(session: Session) -> None:
    st = _store(session)
    p, run = st["p"], st["run"]
    cands = replay.candidates(session, [run], [p], before_step=3, successes_only=True)
    (kept,) = replay.record_replays(session, run, 2, None, [_Draw(p, cands[p][:1])])
    (gone,) = replay.record_replays(session, run, 3, None, [_Draw(p, cands[p])])
    rollback_uncommitted(session, run, after_step=2)
    left = set(session.scalars(sa.text("SELECT attempt_id FROM replays")))
    assert left == set(kept) and not left & set(gone)
    session.execute(sa.text("DELETE FROM rollout_groups WHERE id = (SELECT group_id FROM attempts WHERE id = :a)"),
                    {"a": cands[p][0].attempt_id})  # fmt: skip
    assert session.execute(sa.text("SELECT source_attempt_id, age FROM replays")).all() == [(None, None)]
    assert session.scalar(sa.text("SELECT count(*) FROM attempt_tokens WHERE attempt_id = :a"),
                          {"a": cands[p][0].attempt_id}) == 0  # fmt: skip


def test_reader_reads_replays(db: Engine) -> None:
    result = query_readonly(db, "SELECT count(*) FROM replays")
    assert [tuple(r) for r in result.rows] == [(0,)]


def test_downgrade_deletes_replays_and_restores_the_schema(db: Engine) -> None:
    with Session(db) as session, session.begin():
        st = _store(session)
        cands = replay.candidates(session, [st["run"]], [st["p"]], before_step=3, successes_only=True)
        replay.record_replays(session, st["run"], 3, None, [_Draw(st["p"], cands[st["p"]])])
    migrate.downgrade(db, "0016")
    try:
        with db.connect() as conn:
            assert not sa.inspect(conn).has_table("attempt_tokens")
            assert "replay_of" not in {c["name"] for c in sa.inspect(conn).get_columns("attempts")}
            assert conn.scalar(sa.text("SELECT count(*) FROM rollout_groups WHERE step = 3")) == 2
            assert "replayed" not in conn.scalar(sa.text("SELECT pg_get_viewdef('run_rewards')"))
    finally:
        migrate.upgrade(db)
