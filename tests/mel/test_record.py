"""Rank 0's MEL rows for one step, written from records as the gather delivers them: lessons through the pool's
caps (a dropped one kept as `mel:dropped`, a rejected one as `mel:rejected`), replay groups that name the lesson
they carried, complete pair rows, NLL uses, and the step's `mel/*` metrics; and the step's one write of its groups,
MEL rows and replayed rows (`lanpo.feedback.lifecycle.write_groups`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import trajectories
from lanpo.feedback import lifecycle
from lanpo.feedback.record import GroupRecord, MetaRecord, RolloutRecord, RolloutTokens, write_groups
from lanpo.feedback.record_mel import record_meta
from lanpo.feedback.replay_draw import ReplayDraw
from lanpo.feedback.store import RunRef
from lanpo.mel.config import MELConfig
from tests.db.store_helpers import make_pool, make_problems


def _rollout(correct: bool) -> RolloutRecord:
    return RolloutRecord("y", 1.0 if correct else 0.0, correct, False, 3, False)


def _record(verdict: str | None, replays: list[bool], nll_tokens: int = 0) -> MetaRecord:
    return MetaRecord(
        positive=0,
        negative=1,
        step_split="lines",
        bifurcation_step=2,
        shared_prefix_steps=1,
        located_by="model",
        diagnosis="## Bifurcation\nStep 2\n## Mistake\n...",
        group_success_rate=0.5,
        lesson=None if verdict is None else f"## Mistake\na lesson that was {verdict}",
        replay_prompt="replay prompt",
        replay_prompt_tokens=5,
        replays=[_rollout(c) for c in replays],
        verdict=verdict,
        nll_tokens=nll_tokens,
    )


def test_record_meta_writes_every_row_and_keeps_what_the_caps_drop(session: Session) -> None:
    a, b = make_problems(session, 2)
    pool = make_pool(session, "rec", StoreConfig(per_problem_cap=4, per_step_cap=1))
    mel = MELConfig(pairs_per_problem=1, nll_target="lesson")
    run = runs_repo.create_run(session, "rec", "train", {"method": "mel"}, pool_id=pool.id).id
    # problem a drawn twice in the step, both lessons validated: the per-step cap of 1 admits the better one
    groups = [
        GroupRecord(
            a,
            "zero_shot",
            "q",
            3,
            [],
            [_rollout(True), _rollout(False)],
            meta=[_record("validated", [True, False], nll_tokens=9)],
        ),
        GroupRecord(
            a,
            "zero_shot",
            "q",
            3,
            [],
            [_rollout(True), _rollout(False)],
            meta=[_record("validated", [True, True], nll_tokens=7)],
        ),
        GroupRecord(
            b,
            "zero_shot",
            "q",
            3,
            [],
            [_rollout(True), _rollout(False)],
            meta=[_record("rejected", [False, False]), _record(None, [])],
        ),
        GroupRecord(b, "zero_shot", "q", 3, [], [_rollout(False), _rollout(False)]),
    ]
    attempt_ids = write_groups(session, run, 1, None, groups)
    metrics = record_meta(session, mel, run, pool, 1, None, groups, attempt_ids)  # type: ignore[arg-type]

    assert metrics["mel/groups/qualifying"] == 3 and metrics["mel/pairs"] == 4 and metrics["mel/candidates"] == 3
    assert (metrics["mel/validated"], metrics["mel/rejected"], metrics["mel/yield"]) == (2, 1, 0.5)
    assert metrics["mel/replay/success_rate"] == 0.5 and metrics["mel/pool/added"] == 1
    assert metrics["pool/active"] == 1
    rows = session.execute(
        sa.text(
            "SELECT mp.verdict, e.evicted_by, e.reward, e.source_attempt_id = mp.negative_attempt_id, rg.mode, "
            "gc.experience_version_id = v.id, (SELECT count(*) FROM attempts r WHERE r.group_id = rg.id), "
            "mp.replay_success_rate, u.tokens FROM meta_pairs mp "
            "LEFT JOIN experiences e ON e.id = mp.experience_id "
            "LEFT JOIN experience_versions v ON v.experience_id = e.id "
            "LEFT JOIN rollout_groups rg ON rg.id = mp.replay_group_id "
            "LEFT JOIN group_contexts gc ON gc.group_id = rg.id "
            "LEFT JOIN meta_nll_uses u ON u.experience_id = e.id ORDER BY mp.id"
        )
    ).all()
    assert [tuple(r) for r in rows] == [
        ("validated", "mel:dropped", 0.5, True, "replay", True, 2, 0.5, 9),  # still trained on, kept in history
        ("validated", None, 1.0, True, "replay", True, 2, 1.0, 7),
        ("rejected", "mel:rejected", 0.0, True, "replay", True, 2, 0.0, None),
        (None, None, None, None, None, None, 0, None, None),  # a diagnosis that gave no lesson
    ]
    positives = session.execute(
        sa.text(
            "SELECT bool_and(p.correct AND NOT n.correct AND p.group_id = n.group_id) FROM meta_pairs mp "
            "JOIN attempts p ON p.id = mp.positive_attempt_id JOIN attempts n ON n.id = mp.negative_attempt_id"
        )
    ).scalar()
    assert positives


def test_record_meta_does_nothing_for_other_methods(session: Session) -> None:
    assert record_meta(session, None, 0, None, 1, None, [], []) == {}  # type: ignore[arg-type]


def test_write_groups_writes_a_steps_rows_mel_rows_and_replays_in_one_call(session: Session) -> None:
    """The trainer's one write of a step (`lifecycle.write_groups` given `mel` and `replays`): its groups, their MEL
    pairs with the lessons and replays, the stored trajectories it replayed; MEL's metrics in what it returns."""
    a, b = make_problems(session, 2)
    pool = make_pool(session, "one", StoreConfig())
    run = RunRef(None, runs_repo.create_run(session, "one", "train", {"method": "mel"}, pool_id=pool.id).id, pool)  # type: ignore[arg-type]
    kept = RolloutRecord(
        "y", 1.0, True, False, 3, False, tokens=RolloutTokens([1, 2, 3], [-0.5, -0.2, -1.0], "engine")
    )
    lifecycle.write_groups(session, run, 1, None, [GroupRecord(b, "zero_shot", "q", 3, [], [kept])], "policy")
    stored = trajectories.candidates(session, [run.run_id], [b], 2, True, run.run_id)
    groups = [
        GroupRecord(
            a, "zero_shot", "q", 3, [], [_rollout(True), _rollout(False)], meta=[_record("validated", [True, True])]
        )
    ]
    written = lifecycle.write_groups(
        session, run, 2, None, groups, "policy", mel=MELConfig(), replays=[ReplayDraw(b, stored[b])]
    )

    metrics = written.as_metrics()
    assert (metrics["mel/validated"], metrics["mel/pool/added"], metrics["pool/active"]) == (1, 1, 1)
    modes = session.execute(
        sa.text("SELECT mode, count(*) FROM rollout_groups WHERE step = 2 GROUP BY mode ORDER BY mode")
    ).all()
    assert [tuple(r) for r in modes] == [("replay", 1), ("replayed", 1), ("zero_shot", 1)]
    assert session.scalar(sa.text("SELECT count(*) FROM meta_pairs WHERE step = 2")) == 1
    plain = lifecycle.write_groups(
        session, run, 3, None, [GroupRecord(b, "zero_shot", "q", 3, [], [_rollout(True)])], "p"
    )
    assert not any(name.startswith("mel/") for name in plain.as_metrics())  # no `mel`: the rows alone
