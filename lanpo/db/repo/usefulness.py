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

A write recomputes only the uses at its own keys, and re-sums small rows by version: that cost is bounded by what it
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

Each refresh then refits the pools of the versions it refreshed (`fit_pools`): every graded use of a pool's lessons,
with the lessons each context held beside them, goes into one normal model (`lanpo.lesson_effects`) that tells a
lesson's own effect from its neighbours', and each version's row keeps what that fit says of it alone,
`net_credit` and `net_credit_var` (what `lesson_history.lift`, the value-aware draws, eviction by utility and
retirement read). Unlike the use rows, the fit is the pool's: a write reads every graded use of the pools it
touches (one row per use and lesson) and may rewrite every row of them, as one new use moves its partners'
estimates and theirs. A pool's refreshers take turns on one advisory lock per pool, taken before the rows' locks
(`usefulness_pools_lock.sql`), so the last to commit fits every use committed before it. Two writers skip the fit in
their transaction: a write of ungraded attempts (a server's answers before feedback), which leaves the fit's input
(graded uses and graded baselines) as it was; and `lanpo serve`'s verdicts, which commit their use rows and then
wait for a refit in a transaction of its own (`refit_after`, batched by `lanpo.serve.refit`), begun after their
commit and so fitting their uses.

`of_versions(session, ids)` reads the rows as `Usefulness` dataclasses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from lanpo import lesson_effects
from lanpo.db import sqlfiles
from lanpo.db.repo.sampling import EFFECT_PRIOR_SD

Key = tuple[int | None, int | None, int]  # (run_id, step, problem_id) of a rollout group
MIN_GAIN_VAR = 1e-9  # a use always has some variance (its Beta variances are never 0); a floor against rounding
UNINFORMED_VAR = 1e6  # lift's variance where the uses say nothing of a lesson alone (lanpo_lesson_value: the prior)


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
    net_credit: float = 0.0  # graded * lift: the version's own effect, its partners integrated out (fit_pools)
    net_credit_var: float = 0.0  # graded^2 * the variance of lift

    @property
    def known(self) -> int:
        """Uses with a known outcome (what `store.min_uses` counts)."""
        return self.helped + self.hurt + self.even

    @property
    def lift(self) -> float | None:
        """net_credit / graded: lesson_history.lift; None before any graded use with a baseline."""
        return self.net_credit / self.graded if self.graded else None

    def interval(self, z: float = 1.96) -> tuple[float, float] | None:
        """lift -+ z standard errors (sqrt(net_credit_var) / graded): lesson_history's lift_low and lift_high; None
        before any graded use with a baseline."""
        if not self.graded:
            return None
        half = z * math.sqrt(self.net_credit_var) / self.graded
        return self.net_credit / self.graded - half, self.net_credit / self.graded + half


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
    fit: bool = True,
) -> list[int]:
    """Recompute the rows of every version used by a group at any of `keys`, and of `versions`; those refreshed.

    The `lesson_uses` rows recomputed are those of the groups at `keys` (run, step and problem, none NULL) and of
    `loose_groups` (groups with no run or no step: they never have a baseline, so only their own uses change), of
    the versions refreshed; then each refreshed
    version's `lesson_usefulness` row sums its `lesson_uses` rows. So a write costs what its keys hold, not what
    the versions' histories hold. A version passed but not used at `keys` is re-summed from its rows. One query
    when no version is used at the keys and none is given; none without keys.

    `fit`: refit the refreshed versions' pools in this transaction (`fit_pools`). A writer passes False when its
    write leaves the fit's input as it was (no graded evidence: `record_groups` of ungraded attempts), or when it
    refits after its commit (`lanpo serve`'s verdicts, `refit_after`); the pools' locks are taken either way.
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
    pools = _lock_pools(session, refreshed)  # the pools first, then all rows in one order
    _lock(session, refreshed)
    # a new statement, after the lock: the uses of the locked versions at these keys, as committed so far
    params |= {"loose_group_ids": sorted(set(loose_groups)), "version_ids": refreshed}
    session.execute(sqlfiles.load("queries/usefulness_uses_recompute"), params)
    session.execute(sqlfiles.load("queries/usefulness_recompute"), {"version_ids": refreshed})
    if fit:
        fit_pools(session, pools)
    if retire is not None:
        retire_harmful(session, refreshed, retire)
    return refreshed


def retire_harmful(session: Session, version_ids: Sequence[int], at: RetireAt) -> list[int]:
    """Retire, as 'retired:harmful', the active lessons whose current version is among `version_ids` and whose lift
    is confidently below their pool's `retire_below` (`sql/queries/lessons_retire_harmful.sql`); their ids. Pools
    without `retire_below` retire nothing."""
    params = {"version_ids": sorted(set(version_ids)), "run_id": at.run_id, "step": at.step}
    return sorted(session.scalars(sqlfiles.load("queries/lessons_retire_harmful"), params))


def refresh_at_attempt(session: Session, attempt_id: int, fit: bool = True) -> list[int]:
    """Recompute the rows a verdict on `attempt_id` can change (the uses at its group's key, and their versions);
    `fit` as for `refresh`."""
    key = session.execute(sqlfiles.load("queries/usefulness_key_of_attempt"), {"attempt_id": attempt_id}).first()
    if key is None or key.run_id is None or key.step is None:
        return []  # no attempt, or a group that never has a baseline: a verdict changes no outcome
    return refresh(session, [(key.run_id, key.step, key.problem_id)], fit=fit)


def refit_after(session: Session, pool_ids: Sequence[int]) -> None:
    """Refit `pool_ids` under their locks (taken in pool order, to commit), in a transaction of its own begun after
    the writes it covers committed: it fits every use committed before it took the lock (`lanpo.serve.refit`)."""
    ids = sorted(set(pool_ids))
    if ids:
        session.execute(sqlfiles.load("queries/usefulness_pools_lock_ids"), {"pool_ids": ids}).all()
        fit_pools(session, ids)


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
        pools = _lock_pools(session, ids)
        _lock(session, ids)
        session.execute(sqlfiles.load("queries/usefulness_recompute"), {"version_ids": ids})
        fit_pools(session, pools)


def fit_pools(session: Session | Connection, pool_ids: Sequence[int]) -> None:
    """Fit the effects of each pool's lessons from all its graded uses, and write each version's `net_credit` and
    `net_credit_var` (graded * lift, graded^2 * lift's variance; `lanpo.lesson_effects`), under the store's prior
    `sampling.EFFECT_PRIOR_SD` (eviction's too, so lanpo_lesson_value at it gives back the fit's posterior). Call
    it holding the pools' locks (`refresh`), or with nothing else writing (a migration)."""
    for pool_id in pool_ids:
        uses = session.execute(sqlfiles.load("queries/usefulness_fit_uses"), {"pool_id": pool_id}).one()
        versions, net_credit, net_credit_var = _fit(uses)
        params = {"pool_id": pool_id, "version_ids": versions, "net_credits": net_credit}
        session.execute(sqlfiles.load("queries/usefulness_fit_write"), params | {"net_credit_vars": net_credit_var})


def refit(connection: Connection | Session) -> list[int]:
    """Fit every pool that has a usefulness row (what a migration that changes the fit runs); the pools fitted."""
    pools = list(connection.scalars(sqlfiles.load("queries/usefulness_fit_pools")))
    fit_pools(connection, pools)
    return pools


def _fit(uses: sa.Row) -> tuple[list[int], list[float], list[float]]:
    """The fit of one pool's uses (usefulness_fit_uses.sql: a column of arrays each, one entry per use and version
    its context held): every version in them, with its net_credit and net_credit_var."""
    if uses.group_ids is None:
        return [], [], []
    groups, use = np.unique(np.asarray(uses.group_ids, dtype=np.int64), return_inverse=True)
    versions, lesson = np.unique(np.asarray(uses.version_ids, dtype=np.int64), return_inverse=True)
    gain, gain_var = np.zeros(len(groups)), np.ones(len(groups))
    gain[use] = np.asarray(uses.gain, dtype=np.float64)  # one value per group: any of its entries (they agree)
    gain_var[use] = np.maximum(np.asarray(uses.gain_var, dtype=np.float64), MIN_GAIN_VAR)
    graded = np.bincount(lesson, weights=np.asarray(uses.graded, dtype=np.float64), minlength=len(versions))  # (L,)
    positions = np.asarray(uses.m, dtype=np.float64)
    fit = lesson_effects.fit_effects(use, lesson, positions, gain, gain_var, len(versions), EFFECT_PRIOR_SD)
    lift, lift_var = fit.evidence()
    lift_var = np.minimum(lift_var, UNINFORMED_VAR)  # (L,) finite: a column's CHECK refuses infinity
    return versions.tolist(), (graded * lift).tolist(), (graded**2 * lift_var).tolist()


def _lock_pools(session: Session, version_ids: list[int]) -> list[int]:
    """Take the advisory locks of the versions' pools, in pool order, to commit; the pools."""
    found = session.execute(sqlfiles.load("queries/usefulness_pools_lock"), {"version_ids": version_ids})
    return [r.pool_id for r in found]


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
    (all keys at once): what a migration that changes the per-use estimator runs (then `refit`, where the fit's
    columns exist: from migration 0024). Returns the versions re-summed."""
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
            float(r.net_credit),
            float(r.net_credit_var),
        )
        for r in rows
    }
