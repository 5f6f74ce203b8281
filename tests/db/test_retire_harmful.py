"""Retirement by usefulness (`store.retire_below`): a lesson whose lift is confidently below the bound leaves its
pool as 'retired:harmful', its evidence kept; at, below and above the bound and `min_uses`; never by a server's
writes; undone with the training step that caused it; judged on the current version's record only."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from store_helpers import UNCAPPED, make_experiences, make_pool, make_problems

from lanpo.config import StoreConfig
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo import usefulness
from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.experiences import append_version
from lanpo.db.repo.lessons import retired_as_harmful
from lanpo.errors import ConfigError


def _setup(session: Session, name: str, retire_below: float | None = 0.0, min_uses: int = 2) -> tuple:
    """A pool with these settings, one lesson in it, problems to use it on, and an evaluation run."""
    pool = make_pool(session, name, replace(UNCAPPED, retire_below=retire_below, min_uses=min_uses))
    problems = make_problems(session, 4, dataset=name)
    (version,) = make_experiences(session, problems[0], 1, pool)
    run = runs_repo.create_run(session, name, "eval", {}, pool_id=pool.id).id
    return pool, problems, version, run


def _hurt(session: Session, run: int, problem: int, version: int, retire: bool = True) -> None:
    """One use that hurt: the zero-shot answer right, the answer with the lesson wrong (exact baseline)."""
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [
        NewGroup(problem, "zero_shot", "q", [NewAttempt("r", 1.0, True)], step=0, run_id=run),
        NewGroup(problem, "retrieval", "q", [NewAttempt("r", 0.0, False)], step=0, run_id=run, contexts=lesson),
    ], retire=retire)  # fmt: skip


def _state(session: Session, version: int) -> tuple:
    return session.execute(
        sa.text(
            "SELECT e.evicted_by, e.evicted_run_id, e.evicted_step FROM experiences e "
            "JOIN experience_versions v ON v.experience_id = e.id WHERE v.id = :v"
        ),
        {"v": version},
    ).one()


def _upper(session: Session, version: int) -> float:
    """The upper end of the version's lift's 95 % interval, computed as the query computes it."""
    u = usefulness.of_versions(session, [version])[version]
    return (u.credit + 1.96 * math.sqrt(u.credit_var)) / u.graded


def test_a_lesson_that_hurts_is_retired_once_it_has_min_uses(session: Session) -> None:
    _, problems, version, run = _setup(session, "hurts", min_uses=2)
    _hurt(session, run, problems[1], version)
    assert _state(session, version).evicted_by is None  # below min_uses: 1 known use of 2
    _hurt(session, run, problems[2], version)
    assert tuple(_state(session, version)) == ("retired:harmful", run, 0)  # at min_uses, interval below 0
    kept = usefulness.of_versions(session, [version])[version]
    assert (kept.uses, kept.hurt, kept.graded) == (2, 2, 2)  # its evidence stays
    assert _upper(session, version) < 0
    assert version not in session.scalars(sa.text("SELECT version_id FROM pool_current")).all()
    (shown,) = retired_as_harmful(session, "hurts")  # what lanpo demo prints
    assert (shown.version_id, shown.uses, shown.lift) == (version, 2, -1.0) and shown.lift_high < 0  # type: ignore[operator]
    assert shown.probation == "retired"  # lesson_history says so on its every version


@pytest.mark.parametrize(("offset", "retired"), [(-1e-9, False), (0.0, False), (1e-9, True)])
def test_the_bound_is_strict(session: Session, offset: float, retired: bool) -> None:
    """Retired when the interval's upper end is below retire_below: not at it, nor under it."""
    pool, problems, version, run = _setup(session, f"bound{offset}", retire_below=None)
    for p in problems[1:3]:
        _hurt(session, run, p, version)
    bound = _upper(session, version) + offset
    session.execute(sa.text("UPDATE pools SET retire_below = :b WHERE id = :p"), {"b": bound, "p": pool.id})
    got = usefulness.retire_harmful(session, [version], usefulness.RetireAt())
    assert bool(got) == retired
    assert (_state(session, version).evicted_by == "retired:harmful") == retired


def test_a_lesson_with_a_wide_interval_stays(session: Session) -> None:
    """One use that hurt and one that helped: lift 0, the interval straddles 0."""
    _, problems, version, run = _setup(session, "wide")
    _hurt(session, run, problems[1], version)
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [
        NewGroup(problems[2], "zero_shot", "q", [NewAttempt("r", 0.0, False)], step=0, run_id=run),
        NewGroup(problems[2], "retrieval", "q", [NewAttempt("r", 1.0, True)], step=0, run_id=run, contexts=lesson),
    ])  # fmt: skip
    assert _state(session, version).evicted_by is None


def test_no_bound_and_a_servers_writes_retire_nothing(session: Session) -> None:
    _, problems, version, run = _setup(session, "unset", retire_below=None)
    for p in problems[1:]:
        _hurt(session, run, p, version)
    assert _state(session, version).evicted_by is None
    _, problems, version, run = _setup(session, "served")
    for p in problems[1:]:
        _hurt(session, run, p, version, retire=False)  # lanpo serve's writes: its role may not evict
    assert _state(session, version).evicted_by is None
    assert usefulness.of_versions(session, [version])[version].hurt == 3  # the evidence is there


def test_only_the_current_versions_record_counts(session: Session) -> None:
    _, problems, version, run = _setup(session, "rewritten", retire_below=None)
    for p in problems[1:3]:
        _hurt(session, run, p, version)
    lesson = session.scalar(sa.text("SELECT experience_id FROM experience_versions WHERE id = :v"), {"v": version})
    append_version(session, lesson, "a rewritten lesson")
    session.execute(sa.text("UPDATE pools SET retire_below = 0 WHERE name = 'rewritten'"))
    assert usefulness.retire_harmful(session, [version], usefulness.RetireAt()) == []


def test_a_training_steps_retirement_is_rolled_back_with_it(session: Session) -> None:
    """Retired in a training step's write, tied to its run and step: a resume's rollback brings the lesson back."""
    pool = make_pool(session, "train-retire", replace(UNCAPPED, retire_below=0.0, min_uses=1))
    problems = make_problems(session, 2, dataset="train-retire")
    (version,) = make_experiences(session, problems[0], 1, pool)
    run = runs_repo.create_run(session, "train-retire", "train", {}, pool_id=pool.id).id
    pv = steps_repo.add_policy_version(session, run, 0, "0" * 64)
    steps_repo.commit_step(session, run, 0, pv)
    lesson = [ContextRef(0, experience_version_id=version)]
    record_groups(session, [
        NewGroup(problems[1], "zero_shot", "q", [NewAttempt("r", 1.0, True)] * 3, step=1, run_id=run,
                 policy_version_id=pv),
        NewGroup(problems[1], "inter", "q", [NewAttempt("r", 0.0, False)] * 3, step=1, run_id=run,
                 policy_version_id=pv, contexts=lesson),
    ])  # fmt: skip
    assert tuple(_state(session, version)) == ("retired:harmful", run, 1)
    steps_repo.rollback_uncommitted(session, run, 0)
    assert _state(session, version).evicted_by is None


@pytest.mark.parametrize("value", [-1.0, 1.5, math.nan, math.inf])
def test_a_bound_out_of_range_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match=r"store\.retire_below must be in \(-1, 1\] or unset"):
        StoreConfig(retire_below=value)
    StoreConfig(retire_below=1.0)  # the upper end is allowed
