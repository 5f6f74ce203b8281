"""Usefulness per lesson version (`lesson_usefulness`, migration 0015), kept current by every writer of its evidence.

A use is one rollout group whose context holds the version; its outcome compares the group's graded correctness with
the problem's zero-shot success under the same policy: the zero-shot attempts of the same run, step, problem and
policy version (exact), or in a training run an estimate from the run's zero-shot attempts at the few steps
before its own (docs/concepts.md). Each use has its row in `lesson_uses`, precomputed
(`sql/queries/usefulness_uses_recompute.sql`), and a version's `lesson_usefulness` row sums its use rows
(`sql/queries/usefulness_recompute.sql`). What can change a use's row: its group's writing, a zero-shot group at its
group's (run, step, problem) key (a new baseline) or, in a training run, at any step before its own (the estimate), a
verdict on an attempt there; a rollback deletes uses (their rows cascade). So the writers call:

- `refresh(session, keys, versions, loose_groups)` after writing groups (`attempts.record_groups`: the keys of its
  zero-shot groups and of its groups that use a lesson, the versions those use, and its groups with no run or step
  that use one): the uses at those keys, in a training run at every step after its earliest key (in training none
  is written yet), and of those groups are recomputed, and the rows of every version used there re-summed;
- `refresh_at_attempt` after a verdict (`serving.record_feedback`): the same at the attempt's key;
- a writer that may retire lessons (training and evaluation; not a server, whose role may not evict) passes
  `retire=RetireAt(run, step)`: of the versions refreshed, the current versions of active lessons whose lift is
  confidently below their pool's `retire_below` leave the pool as 'retired:harmful' (`retire_harmful`);
- `used_by_run_after` before a rollback deletes groups, and `refresh_versions` after (`steps.rollback_uncommitted`):
  re-sums the versions that lost uses.

A write recomputes only the uses at its own keys, and re-sums small rows by version: its cost is bounded by what it
wrote, not by the length of the versions' histories. Rows are recomputed from the evidence, never incremented, so a
refresh is idempotent and repairs the rows it covers (a use's row, by a refresh at its key). Concurrency (two
transactions writing uses of one version, READ COMMITTED): each refresher inserts the missing version rows (ON
CONFLICT DO NOTHING, waiting on a concurrent inserter of the same row), locks them FOR UPDATE in version order, and
only then recomputes the use rows of the locked versions at its keys and re-sums the version rows, in new statements.
The lock is held to commit. So of two refreshers of a version the second waits until the first commits; its
statements then take fresh snapshots that hold every use row committed so far (the first's included) and its own
uncommitted ones: the last refresher to commit writes a row that sums every committed use, and no use is lost. A use
row is written only under its version's lock, so two writers of one use row are serialized the same way. One order
(version id) for inserts and locks: no deadlock between two refreshes. A limit: a zero-shot group written at a key
while another transaction writes a use at the same key, both uncommitted, is seen by neither refresh (no version to
lock is known yet); lanpo's writers of one (run, step) write it in one transaction (a training step, an evaluation),
except two concurrent serve requests on one question, and the next refresh at that key (a verdict there, another
group there) repairs that use's row.

`of_versions(session, ids)` reads the rows as `Usefulness` dataclasses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection
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
    credit_var: float = 0.0  # the variance of credit (its uses' summed, taken as independent)

    @property
    def known(self) -> int:
        """Uses with a known outcome (what `store.min_uses` counts)."""
        return self.helped + self.hurt + self.even

    @property
    def lift(self) -> float | None:
        """credit / graded: experience_usage.lift; None before any graded use with a baseline."""
        return self.credit / self.graded if self.graded else None

    def interval(self, z: float = 1.96) -> tuple[float, float] | None:
        """lift -+ z standard errors (sqrt(credit_var) / graded); None before any graded use with a baseline."""
        if not self.graded:
            return None
        half = z * math.sqrt(self.credit_var) / self.graded
        return self.credit / self.graded - half, self.credit / self.graded + half


@dataclass(frozen=True)
class RetireAt:
    """Retire the harmful lessons among those a refresh touched, tied to this run and step (None: neither)."""

    run_id: int | None = None
    step: int | None = None


def refresh(
    session: Session,
    keys: Iterable[Key],
    versions: Iterable[int] = (),
    loose_groups: Iterable[int] = (),
    retire: RetireAt | None = None,
) -> list[int]:
    """Recompute the rows of every version used by a group at any of `keys`, and of `versions`; those refreshed.

    The `lesson_uses` rows recomputed are those of the groups at `keys` (run, step and problem, none NULL) and of
    `loose_groups` (groups with no run or no step: they never have a baseline, so only their own uses change), of
    the versions refreshed; then each refreshed
    version's `lesson_usefulness` row sums its `lesson_uses` rows. So a write costs what its keys hold, not what
    the versions' histories hold. A version passed but not used at `keys` is re-summed from its rows. One query
    when no version is used at the keys and none is given; none without keys.
    """
    full = sorted(k for k in set(keys) if k[0] is not None and k[1] is not None)  # type: ignore[type-var]
    params: dict[str, list] = {
        "run_ids": [k[0] for k in full],
        "steps": [k[1] for k in full],
        "problem_ids": [k[2] for k in full],
    }
    found: list[int] = []
    if full:
        found = list(session.scalars(sqlfiles.load("queries/usefulness_versions_at"), params))
    refreshed = sorted({*found, *versions})
    if not refreshed:
        return refreshed
    _lock(session, refreshed)  # one pass: all rows locked in one order
    # a new statement, after the lock: the uses of the locked versions at these keys, as committed so far
    params |= {"loose_group_ids": sorted(set(loose_groups)), "version_ids": refreshed}
    session.execute(sqlfiles.load("queries/usefulness_uses_recompute"), params)
    session.execute(sqlfiles.load("queries/usefulness_recompute"), {"version_ids": refreshed})
    if retire is not None:
        retire_harmful(session, refreshed, retire)
    return refreshed


def retire_harmful(session: Session, version_ids: Sequence[int], at: RetireAt) -> list[int]:
    """Retire, as 'retired:harmful', the active lessons whose current version is among `version_ids` and whose lift
    is confidently below their pool's `retire_below` (`sql/queries/lessons_retire_harmful.sql`); their ids. Pools
    without `retire_below` retire nothing."""
    params = {"version_ids": sorted(set(version_ids)), "run_id": at.run_id, "step": at.step}
    return sorted(session.scalars(sqlfiles.load("queries/lessons_retire_harmful"), params))


def refresh_at_attempt(session: Session, attempt_id: int) -> list[int]:
    """Recompute the rows a verdict on `attempt_id` can change (the uses at its group's key, and their versions)."""
    key = session.execute(sqlfiles.load("queries/usefulness_key_of_attempt"), {"attempt_id": attempt_id}).first()
    if key is None or key.run_id is None or key.step is None:
        return []  # no attempt, or a group that never has a baseline: a verdict changes no outcome
    return refresh(session, [(key.run_id, key.step, key.problem_id)])


def used_by_run_after(session: Session, run_id: int, after_step: int) -> list[int]:
    """The versions run `run_id`'s groups of steps > `after_step` use: read them before a rollback deletes them."""
    params = {"run_id": run_id, "after_step": after_step}
    return list(session.scalars(sqlfiles.load("queries/usefulness_versions_of_run"), params))


def refresh_versions(session: Session, version_ids: Sequence[int]) -> None:
    """Lock the versions' rows in version order to commit, then recompute them from their `lesson_uses` rows (see
    the module's note on why this loses no use): after a rollback, whose deleted groups took their use rows with
    them. Versions that no longer exist are skipped."""
    ids = sorted(set(version_ids))
    if ids:
        _lock(session, ids)
        session.execute(sqlfiles.load("queries/usefulness_recompute"), {"version_ids": ids})


def _lock(session: Session, ids: list[int]) -> None:
    """Insert the missing rows of `ids` (sorted) and lock them, to commit."""
    params = {"version_ids": ids}
    session.execute(sqlfiles.load("queries/usefulness_insert_missing"), params)  # so that there is a row to lock
    # held to commit: another refresher of any of these rows waits here until this transaction commits, and ...
    session.execute(sqlfiles.load("queries/usefulness_lock"), params)
    # ... what follows, new statements, read a snapshot taken after the lock was granted: every use committed by an
    # earlier refresher, and this transaction's own. One statement that both read and upserted would read its
    # snapshot before waiting on the row, and overwrite the earlier refresher's count with one that misses its use.


def rebuild(connection: Connection | Session) -> list[int]:
    """Recompute every use in the history and re-sum every version a context ever held, by the writers' statements
    (all keys at once): what a migration that changes the estimator runs. Returns the versions re-summed."""
    connection.execute(sqlfiles.load("queries/usefulness_insert_all"))
    used = list(connection.scalars(sa.text("SELECT version_id FROM lesson_usefulness ORDER BY version_id")))
    if not used:
        return used
    keys = connection.execute(sqlfiles.load("queries/usefulness_all_keys")).all()
    full = [k for k in keys if k.run_id is not None and k.step is not None]
    params = {
        "run_ids": [k.run_id for k in full],
        "steps": [k.step for k in full],
        "problem_ids": [k.problem_id for k in full],
        "loose_group_ids": sorted(k.group_id for k in keys if k.run_id is None or k.step is None),
        "version_ids": used,
    }
    connection.execute(sqlfiles.load("queries/usefulness_uses_recompute"), params)
    connection.execute(sqlfiles.load("queries/usefulness_recompute"), {"version_ids": used})
    return used


def of_versions(session: Session, version_ids: Iterable[int]) -> dict[int, Usefulness]:
    """The rows of `version_ids` (a version without one: absent; `Usefulness(id)` reads as never used)."""
    rows = session.execute(sqlfiles.load("queries/usefulness_of_versions"), {"version_ids": sorted(set(version_ids))})
    return {
        int(r.version_id): Usefulness(
            int(r.version_id),
            r.uses,
            r.helped,
            r.hurt,
            r.even,
            r.unknown,
            r.graded,
            float(r.credit),
            float(r.credit_var),
        )
        for r in rows
    }
