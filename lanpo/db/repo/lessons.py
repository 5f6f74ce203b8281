"""A lesson's life by hand and on record: retire one (`lanpo pool retire`), read its chain of versions with their
usefulness (`lanpo pool history`, from the `lesson_history` view)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo import checks
from lanpo.errors import InputError

RETIRED_BY = "manual:retired"
# lesson_history.probation, in the order a reader meets them: the lesson retired by its record ('retired:harmful',
# on every version), no graded attempt yet, then the version's lift's 95 % interval above 0, below 0, or spanning it
PROBATION = ("retired", "untried", "helps", "hurts", "trying")
HISTORY_HINT = "`lanpo pool history LESSON` shows a lesson's chain and state"


@dataclass(frozen=True)
class Retired:
    experience_id: int
    pool: str
    evicted_at: datetime
    note: str


@dataclass(frozen=True)
class HistoryRow:
    """One version of a lesson, as `lesson_history` shows it (the lesson's columns repeat on each version)."""

    experience_id: int
    pool_id: int
    pool: str
    source_problem_id: int
    kind: str
    version_id: int
    version: int
    reason: str
    similarity: float | None
    summary: str
    author: str | None
    policy_version_id: int | None
    policy_step: int | None
    run_id: int | None
    step: int | None
    source_attempt_id: int | None  # the rollout the version was summarised from
    reward: float | None  # that rollout's reward
    created_at: datetime
    is_current: bool
    active: bool
    evicted_by: str | None
    evicted_at: datetime | None
    evicted_run_id: int | None
    evicted_step: int | None
    evicted_note: str | None
    uses: int
    helped: int
    hurt: int
    even: int
    unknown: int
    graded: int
    credit: float
    lift: float | None
    credit_var: float  # the variance of credit
    lift_low: float | None  # lift's 95 % interval
    lift_high: float | None
    probation: str  # one of PROBATION: the version's state, from that interval and the lesson's retirement
    net_credit: float  # graded * lift: the version's own effect, the lessons drawn beside it integrated out
    net_credit_var: float  # graded^2 * lift's variance


def _lesson_id(value: int) -> int:
    return checks.row_id(value, "lesson id", hint="a lesson is an experiences.id: `SELECT * FROM pool_current`")


def _when(at: datetime) -> str:
    return at.isoformat(sep=" ", timespec="seconds")


def retire(session: Session, experience_id: int, note: str, pool_id: int | None = None) -> Retired:
    """Retire the active lesson `experience_id` by hand, `note` saying why; InputError, writing nothing, when it
    does not exist, is not in pool `pool_id` (when given), has already left its pool, or `note` is empty."""
    experience_id = _lesson_id(experience_id)
    checks.refuse_nul(note, "the reason")
    checks.check_size(note, "the reason")
    if not note.strip():
        raise InputError("the reason is empty", hint="say why the lesson goes: --reason 'misleads on X'")
    found = session.execute(sqlfiles.load("queries/lesson_lock"), {"experience_id": experience_id}).one_or_none()
    if found is None:
        raise InputError(f"no lesson with id {experience_id}", hint="active lessons: `SELECT * FROM pool_current`")
    if pool_id is not None and found.pool_id != pool_id:
        raise InputError(
            f"lesson {experience_id} is in pool {found.pool!r}, not the pool named by --pool",
            hint=f"pass --pool {found.pool}, or leave --pool out",
        )
    if found.evicted_at is not None:
        why = f" ({found.evicted_note})" if found.evicted_note else ""
        raise InputError(
            f"lesson {experience_id} already left pool {found.pool!r} at {_when(found.evicted_at)}: "
            f"evicted_by {found.evicted_by}{why}",
            hint=HISTORY_HINT,
        )
    at = session.scalar(sqlfiles.load("queries/lesson_retire"), {"experience_id": experience_id, "note": note})
    return Retired(experience_id, found.pool, at, note)


def history(session: Session, experience_id: int) -> list[HistoryRow]:
    """Every version of lesson `experience_id`, oldest first, with its state and usefulness; InputError when there
    is no such lesson."""
    experience_id = _lesson_id(experience_id)
    rows = [
        HistoryRow(**r._mapping)
        for r in session.execute(sqlfiles.load("queries/lesson_history_of"), {"experience_id": experience_id})
    ]
    if not rows:
        raise InputError(f"no lesson with id {experience_id}", hint="lessons: `SELECT * FROM lesson_history`")
    return rows


def retired_as_harmful(session: Session, pool: str) -> list[HistoryRow]:
    """The current versions of pool `pool`'s lessons retired as 'retired:harmful' (`store.retire_below`)."""
    rows = session.execute(sqlfiles.load("queries/lessons_retired_harmful"), {"pool": pool})
    return [HistoryRow(**r._mapping) for r in rows]
