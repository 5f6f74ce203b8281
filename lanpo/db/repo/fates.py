"""What a trainer decides about its groups after they are written (migration 0023): the name it gives a group
(verl's uid), the step that trained or dropped it and why, and the weights of each response's segments.

lanpo's own trainer and TRL train a group in the step that generated it and leave all of this NULL. verl's
asynchronous modes train a group steps later, drop some, and re-issue the ones a crash left in flight under the
same uid: `replace_keyed` removes what a killed run wrote of those, `consume` records each fate once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models import DROP_REASONS
from lanpo.db.repo import usefulness
from lanpo.errors import InputError, listing


@dataclass(frozen=True)
class Consumed:
    """One consumption: the groups marked trained and dropped now, and the names the store holds no group of."""

    trained: int
    dropped: dict[str, int]  # reason -> groups
    missing: tuple[str, ...]  # names of groups never written (a failed group's sessions wrote nothing)
    again: tuple[str, ...] = ()  # names of groups consumed before (kept at their first fate)


def replace_keyed(session: Session, run_id: int, uids: Sequence[str]) -> int:
    """Delete the run's groups named `uids` and the lessons written from them: a group re-issued after a resume
    (verl restores its in-flight prompts under their uids) is written again. Returns the groups deleted."""
    if not uids:
        return 0
    rows = session.execute(sqlfiles.load("queries/fates_keyed"), {"run_id": run_id, "uids": list(uids)}).all()
    if not rows:
        return 0
    ids = [r.id for r in rows]
    session.execute(sqlfiles.load("queries/fates_replace_lessons"), {"run_id": run_id, "group_ids": ids})
    session.execute(sqlfiles.load("queries/fates_replace_groups"), {"group_ids": ids})
    usefulness.refresh_versions(session, [v for r in rows for v in r.used])  # their uses went with them
    return len(ids)


def name_groups(session: Session, first_attempt_ids: Sequence[int], uids: Sequence[str | None]) -> None:
    """Give written groups (each found by its first attempt's id) the trainer's names (None: unnamed)."""
    named = [{"id": a, "uid": u} for a, u in zip(first_attempt_ids, uids, strict=True) if u is not None]
    if named:
        session.execute(sqlfiles.load("queries/fates_name"), named)


def set_segments(session: Session, rows: Sequence[tuple[int, int | None, int | None]]) -> None:
    """(attempt id, first segment's policy version id, last segment's) of responses generated under several
    versions (partial rollout); a row with both None is left as it is (one version: its group's)."""
    given = [{"id": a, "first": f, "last": last} for a, f, last in rows if f is not None or last is not None]
    if given:
        session.execute(sqlfiles.load("queries/fates_segments"), given)


def consume(session: Session, run_id: int, step: int, trained: Sequence[str], dropped: Mapping[str, str]) -> Consumed:
    """Groups a trainer took off its buffer at `step`: `trained` ones, and `dropped` ones (uid -> reason). Each
    group's first fate stands; a name the run holds no group of is reported, not invented."""
    bad = sorted({r for r in dropped.values() if r not in DROP_REASONS})
    if bad:
        raise InputError(f"unknown drop reason {bad[0]!r}", hint=f"one of {listing(DROP_REASONS)}")
    overlap = set(trained) & set(dropped)
    if overlap:
        raise InputError(f"group {sorted(overlap)[0]!r} is both trained and dropped at step {step}")
    asked = [*trained, *dropped]
    known = {
        r.trainer_uid: r.consumed_step
        for r in session.execute(sqlfiles.load("queries/fates_keyed"), {"run_id": run_id, "uids": asked})
    }
    counts: dict[str | None, int] = {}
    for reason, uids in [(None, list(trained)), *_by_reason(dropped)]:
        params = {"run_id": run_id, "step": step, "dropped": reason, "uids": uids}
        counts[reason] = len(session.execute(sqlfiles.load("queries/fates_consume"), params).all())
    missing = tuple(u for u in asked if u not in known)
    again = tuple(u for u in asked if known.get(u) is not None)
    dropped_counts = {r: n for r, n in counts.items() if r is not None and n}
    return Consumed(counts[None], dropped_counts, missing, again)


def _by_reason(dropped: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    grouped: dict[str, list[str]] = {}
    for uid, reason in dropped.items():
        grouped.setdefault(reason, []).append(uid)
    return sorted(grouped.items())
