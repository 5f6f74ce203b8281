"""Usefulness per lesson version (`lesson_usefulness`, migration 0015), kept current by every writer of its evidence.

A use is one rollout group whose context holds the version; its outcome compares the group's graded correctness with
the zero-shot baseline of the same run, step, problem and policy version (`experience_usage`'s estimator; the SQL
is `sql/queries/usefulness_recompute.sql`). What can change a version's row: a group that uses it, a zero-shot group
at the (run, step, problem) key of one of its uses (a new baseline), a verdict on an attempt at such a key, and a
rollback that deletes uses. So the writers call:

- `refresh(session, keys, versions)` after writing groups (`attempts.record_groups`: the keys of its zero-shot groups
  and of its groups that use a lesson, and the versions those use): every version used at those keys is recomputed;
- `refresh_at_attempt` after a verdict (`serving.record_feedback`): the versions used at the attempt's key;
- `used_by_run_after` before a rollback deletes groups, and `refresh_versions` after (`steps.rollback_uncommitted`).

Rows are recomputed from the evidence, never incremented, so a refresh is idempotent and repairs any row. Concurrency
(two transactions writing uses of one version, READ COMMITTED): each refresher inserts the missing rows (ON CONFLICT
DO NOTHING, waiting on a concurrent inserter of the same row), locks them FOR UPDATE in version order, and only then
recomputes, in a new statement. The lock is held to commit. So of two refreshers of a version the second waits until
the first commits; its recompute statement then takes a fresh snapshot that holds every use committed so far (the
first's included) and its own uncommitted ones: the last refresher to commit writes a row that counts every committed
use, and no use is lost. One order (version id) for inserts and locks: no deadlock between two refreshes. A limit:
a zero-shot group written at a key while another transaction writes a use at the same key, both uncommitted, is
seen by neither refresh (no version to lock is known yet); lanpo's writers of one (run, step) write it in one
transaction (a training step, an evaluation), except two concurrent serve requests on one question, and the next
refresh of the version repairs its row.

`of_versions(session, ids)` reads the rows as `Usefulness` dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles

Key = tuple[int | None, int | None, int]  # (run_id, step, problem_id) of a rollout group


@dataclass(frozen=True)
class Usefulness:
    """One lesson version's uses by outcome, and its credited gain over the zero-shot baseline."""

    version_id: int
    uses: int = 0
    helped: int = 0
    hurt: int = 0
    even: int = 0
    unknown: int = 0
    graded: int = 0  # graded attempts of its uses that had a baseline
    credit: float = 0.0  # their summed (correct - baseline) / k

    @property
    def known(self) -> int:
        """Uses with a known outcome (what `store.min_uses` counts)."""
        return self.helped + self.hurt + self.even

    @property
    def lift(self) -> float | None:
        """credit / graded: experience_usage.lift; None before any graded use with a baseline."""
        return self.credit / self.graded if self.graded else None


def refresh(session: Session, keys: Iterable[Key], versions: Iterable[int] = ()) -> list[int]:
    """Recompute the rows of every version used by a group at any of `keys`, and of `versions`; those refreshed.

    A key with no run or step is dropped: such a group never has a baseline, so only its own versions (pass them
    as `versions`) change. One query when no version is used at the keys and none is given; none without keys.
    """
    wanted = sorted({k for k in keys if k[0] is not None and k[1] is not None})  # type: ignore[type-var]
    found: list[int] = []
    if wanted:
        params = {
            "run_ids": [k[0] for k in wanted],
            "steps": [k[1] for k in wanted],
            "problem_ids": [k[2] for k in wanted],
        }
        found = list(session.scalars(sqlfiles.load("queries/usefulness_versions_at"), params))
    refreshed = sorted({*found, *versions})
    refresh_versions(session, refreshed)  # one pass: all rows locked in one order
    return refreshed


def refresh_at_attempt(session: Session, attempt_id: int) -> list[int]:
    """Recompute the rows a verdict on `attempt_id` can change (versions used at its group's key)."""
    found = session.scalars(sqlfiles.load("queries/usefulness_versions_at_attempt"), {"attempt_id": attempt_id})
    versions = list(found)
    refresh_versions(session, versions)
    return versions


def used_by_run_after(session: Session, run_id: int, after_step: int) -> list[int]:
    """The versions run `run_id`'s groups of steps > `after_step` use: read them before a rollback deletes them."""
    params = {"run_id": run_id, "after_step": after_step}
    return list(session.scalars(sqlfiles.load("queries/usefulness_versions_of_run"), params))


def refresh_versions(session: Session, version_ids: Sequence[int]) -> None:
    """Insert the missing rows, lock them in version order to commit, then recompute them (see the module's note on
    why this loses no use). Versions that no longer exist are skipped."""
    ids = sorted(set(version_ids))
    if not ids:
        return
    params = {"version_ids": ids}
    session.execute(sqlfiles.load("queries/usefulness_insert_missing"), params)  # so that there is a row to lock
    # held to commit: another refresher of any of these rows waits here until this transaction commits, and ...
    session.execute(sqlfiles.load("queries/usefulness_lock"), params)
    # ... this recompute, a new statement, reads a snapshot taken after the lock was granted: every use committed
    # by an earlier refresher, and this transaction's own. One statement that both read and upserted would read its
    # snapshot before waiting on the row, and overwrite the earlier refresher's count with one that misses its use.
    session.execute(sqlfiles.load("queries/usefulness_recompute"), params)


def of_versions(session: Session, version_ids: Iterable[int]) -> dict[int, Usefulness]:
    """The rows of `version_ids` (a version without one: absent; `Usefulness(id)` reads as never used)."""
    rows = session.execute(sqlfiles.load("queries/usefulness_of_versions"), {"version_ids": sorted(set(version_ids))})
    return {
        int(r.version_id): Usefulness(
            int(r.version_id), r.uses, r.helped, r.hurt, r.even, r.unknown, r.graded, float(r.credit)
        )
        for r in rows
    }
