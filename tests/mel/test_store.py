"""MEL in the store: a rejected lesson stays in history without ever joining the active pool, validated ones obey
the pool's caps, provenance rows refuse half a candidate, rows cascade away with their attempts (resume), and
migration 0006 goes up, down and up again on a filled database."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db import migrate
from lanpo.db.repo import experiences as experiences_repo
from lanpo.db.repo import meta as meta_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import NewExperience
from lanpo.errors import InputError
from tests.db.store_helpers import make_pool, make_problems


def _lesson(problem_id: int, text: str, reward: float, run_id: int, step: int = 1) -> NewExperience:
    return NewExperience(problem_id, text, reward, kind="meta", run_id=run_id, step=step, author="policy")


CAPS = StoreConfig(per_problem_cap=2, per_step_cap=2)


def _fill(session: Session, store: StoreConfig = CAPS) -> dict:
    """A MEL step on problem a: a group of 2 (y+, y-), a validated lesson with its replays, a rejected one."""
    a, b = make_problems(session, 2)
    pool = make_pool(session, "mel", store)
    run = runs_repo.create_run(session, "mel-run", "train", {"method": "mel"}, pool_id=pool.id).id
    steps_repo.commit_step(session, run, 0)
    (pos, neg), (other,) = record_groups(
        session,
        [
            NewGroup(
                a, "zero_shot", "q", [NewAttempt("y+", 1.0, True), NewAttempt("y-", 0.0, False)], step=1, run_id=run
            ),
            NewGroup(b, "zero_shot", "q", [NewAttempt("z", 0.0, False)], step=1, run_id=run),
        ],
    )
    kept = experiences_repo.add_experiences(session, pool, [_lesson(a, "a lesson that helped", 1.0, run)])
    gone = experiences_repo.add_evicted(session, pool, [_lesson(a, "a lesson that did not", 0.0, run)], "mel:rejected")
    replays = record_groups(
        session,
        [
            NewGroup(
                a,
                "replay",
                "q + lesson",
                [NewAttempt("r", 1.0, True), NewAttempt("r", 1.0, True)],
                step=1,
                run_id=run,
                contexts=[ContextRef(0, kept.version_ids[0])],
            ),
            NewGroup(
                a,
                "replay",
                "q + lesson",
                [NewAttempt("r", 0.0, False), NewAttempt("r", 1.0, True)],
                step=1,
                run_id=run,
                contexts=[ContextRef(0, gone.version_ids[0])],
            ),
        ],
    )
    groups = [session.scalar(sa.text("SELECT group_id FROM attempts WHERE id = :i"), {"i": r[0]}) for r in replays]
    base = dict(
        run_id=run,
        step=1,
        problem_id=a,
        positive_attempt_id=pos,
        negative_attempt_id=neg,
        step_split="lines",
        bifurcation_step=2,
        shared_prefix_steps=1,
        located_by="model",
        diagnosis="## Bifurcation\nStep 2",
        prompt_version="mel-diagnosis-v1",
        group_success_rate=0.5,
    )
    pair_ids = meta_repo.record_pairs(
        session,
        [
            meta_repo.NewMetaPair(
                **base,
                experience_id=kept.experience_ids[0],
                replay_group_id=groups[0],
                replay_success_rate=1.0,
                validation_rule="beats_group",
                verdict="validated",
            ),
            meta_repo.NewMetaPair(
                **base,
                experience_id=gone.experience_ids[0],
                replay_group_id=groups[1],
                replay_success_rate=0.5,
                validation_rule="beats_group",
                verdict="rejected",
            ),
            meta_repo.NewMetaPair(**{**base, "located_by": "heuristic"}),  # a diagnosis without a lesson
        ],
    )
    meta_repo.record_nll_uses(session, [meta_repo.NewNllUse(kept.experience_ids[0], run, 1, "lesson", 17)])
    steps_repo.commit_step(session, run, 1)
    return {"a": a, "b": b, "run": run, "pool": pool, "pairs": pair_ids, "kept": kept, "gone": gone, "other": other}


def test_rejected_lessons_stay_in_history_outside_the_active_pool(session: Session) -> None:
    ids = _fill(session)
    assert pools_repo.active_size(session, ids["pool"].id) == 1
    current = session.execute(sa.text("SELECT kind, summary FROM pool_current")).all()
    assert [tuple(r) for r in current] == [("meta", "a lesson that helped")]
    history = session.execute(
        sa.text("SELECT summary, active, evicted_by FROM experience_history ORDER BY experience_id")
    ).all()
    assert [tuple(r) for r in history] == [
        ("a lesson that helped", True, None),
        ("a lesson that did not", False, "mel:rejected"),
    ]
    with pytest.raises(InputError, match="<scope>:<reason>"):
        experiences_repo.add_evicted(session, ids["pool"], [_lesson(ids["a"], "x" * 30, 0.0, ids["run"])], "nope")


def test_views_follow_a_pair_to_its_lesson_replays_verdict_and_nll_steps(session: Session) -> None:
    ids = _fill(session)
    rows = meta_repo.history(session, ids["run"])
    assert [(r.verdict, r.replays, r.replay_successes, r.active, r.evicted_by, r.nll_steps) for r in rows] == [
        ("validated", 2, 2, True, None, [1]),
        ("rejected", 2, 1, False, "mel:rejected", None),
        (None, None, None, False, None, None),  # no lesson: no replay
    ]
    assert rows[0].meta_experience == "a lesson that helped" and rows[0].version_id == ids["kept"].version_ids[0]
    assert rows[2].experience_id is None and rows[2].located_by == "heuristic"
    (step,) = meta_repo.step_yield(session, ids["run"])
    assert (step.step, step.qualifying_groups, step.pairs, step.candidates, step.validated, step.rejected) == (
        1,
        1,
        3,
        2,
        1,
        1,
    )
    assert step.validation_yield == pytest.approx(1 / 3) and step.replay_success_rate == pytest.approx(0.75)
    assert (step.nll_examples, step.nll_tokens) == (1, 17)


def test_validated_lessons_obey_the_pool_caps(session: Session) -> None:
    a, _ = make_problems(session, 2)
    pool = make_pool(session, "capped", StoreConfig(per_problem_cap=2, per_step_cap=2))
    run = runs_repo.create_run(session, "capped", "train", {}, pool_id=pool.id).id
    added = experiences_repo.add_experiences(
        session, pool, [_lesson(a, f"lesson number {i} of this step", float(i) / 4, run) for i in range(3)]
    )
    assert added.dropped == [0]  # the per-step cap keeps the two best replay rates
    experiences_repo.add_experiences(session, pool, [_lesson(a, "a later lesson on this problem", 1.0, run, 2)])
    assert pools_repo.active_size(session, pool.id) == 2  # the per-problem cap evicted the oldest
    experiences_repo.add_evicted(
        session, pool, [_lesson(a, "a rejected lesson, never counted", 0.0, run, 2)], "mel:rejected"
    )
    assert pools_repo.active_size(session, pool.id) == 2


def test_half_a_candidate_and_bad_targets_are_refused(session: Session) -> None:
    ids = _fill(session)
    base = meta_repo.NewMetaPair(
        ids["run"],
        1,
        ids["a"],
        ids["other"],
        ids["other"] + 1,
        "lines",
        1,
        0,
        "model",
        "d",
        None,
        0.5,
        experience_id=ids["kept"].experience_ids[0],
    )
    with pytest.raises(InputError, match="set together"):
        meta_repo.record_pairs(session, [base])
    with pytest.raises(InputError, match="target must be one of"):
        meta_repo.record_nll_uses(session, [meta_repo.NewNllUse(1, ids["run"], 1, "trajectory", 3)])
    with pytest.raises(InputError, match="a replay target names its attempt"):
        meta_repo.record_nll_uses(session, [meta_repo.NewNllUse(1, ids["run"], 1, "replay", 3)])


def test_resume_rollback_takes_the_mel_rows_of_uncommitted_steps(session: Session) -> None:
    ids = _fill(session)
    rolled = steps_repo.rollback_uncommitted(session, ids["run"], 0)
    assert rolled.groups == 4 and rolled.experiences == 2
    for table in ("meta_pairs", "meta_nll_uses", "experiences"):
        assert session.scalar(sa.text(f"SELECT count(*) FROM {table}")) == 0, table


def test_migration_0006_down_and_up_on_a_filled_database(db: Engine, session: Session) -> None:
    _fill(session)
    session.commit()
    migrate.downgrade(db, "0005")
    try:
        with db.connect() as conn:
            names = set(sa.inspect(conn).get_table_names()) | set(sa.inspect(conn).get_view_names())
            assert not names & {"meta_pairs", "meta_nll_uses", "meta_experience_history", "meta_experience_yield"}
            assert conn.scalar(sa.text("SELECT count(*) FROM rollout_groups WHERE mode = 'replay'")) == 0
            assert conn.scalar(sa.text("SELECT count(*) FROM attempts")) == 3  # the step's own attempts stay
            assert conn.scalar(sa.text("SELECT count(*) FROM experiences WHERE kind = 'meta'")) == 2
        with pytest.raises(sa.exc.IntegrityError), db.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO rollout_groups (problem_id, mode, prompt) "
                    "SELECT id, 'replay', 'p' FROM problems LIMIT 1"
                )
            )
    finally:
        migrate.upgrade(db)
    with db.begin() as conn:  # up again: the tables are back, empty, and replay groups are allowed again
        assert conn.scalar(sa.text("SELECT count(*) FROM meta_pairs")) == 0
        conn.execute(
            sa.text(
                "INSERT INTO rollout_groups (problem_id, mode, prompt) SELECT id, 'replay', 'p' FROM problems LIMIT 1"
            )
        )
        assert conn.scalar(sa.text("SELECT count(*) FROM meta_experience_yield")) == 1  # the run's committed step 1


def test_replay_group_ids_name_the_group_of_each_attempt(session: Session) -> None:
    (a,) = make_problems(session, 1)
    pool = make_pool(session, "groups", CAPS)
    run = runs_repo.create_run(session, "groups-run", "train", {"method": "mel"}, pool_id=pool.id).id
    attempts = record_groups(
        session,
        [NewGroup(a, "zero_shot", "q", [NewAttempt("r", 1.0, True), NewAttempt("s", 0.0, False)], step=1, run_id=run)]
        * 2,
    )
    firsts = [ids[0] for ids in attempts]
    want = {i: session.scalar(sa.text("SELECT group_id FROM attempts WHERE id = :i"), {"i": i}) for i in firsts}
    assert meta_repo.replay_group_ids(session, firsts) == want and len(set(want.values())) == 2
    assert meta_repo.replay_group_ids(session, []) == {}
