"""Capacity policies of an experience pool, enforced inside the inserting transaction.

Three caps, settings of the pool (`pools` row): per step (new experiences per problem admitted by one
`add_experiences` call, best reward first, the rest dropped and reported), per problem (active experiences of the
pool kept per problem) and an optional global cap (active experiences in the pool). When a cap is exceeded the
eviction policy
picks who leaves: `oldest`, `lowest_reward` (NULL rewards first), `lowest_relevance` (relevance of an
experience = mean score of the relevance_scores rows naming one of its versions, else of the rows naming
its problem as the candidate, else 0) or `lowest_utility` (the lowest expected lift first: a lesson whose current
version has at least `min_uses` uses with a known outcome, `lesson_usefulness` helped + hurt + even, at its lift
shrunk toward 0 under the value-aware draws' prior, `lanpo_lesson_value` at z = 0; an untried one at 0, so the
lessons known to hurt leave first, then the untried and those known to do nothing, oldest first, and the lessons
known to help last).
Ties fall back to age. Evicted rows get `evicted_at = now()` and `evicted_by = '<scope>:<policy>'` (scope:
per_problem | global) and stay in history.

Expiry (`expire`, `max_policy_age`): before a training step adds its lessons, the pool's active lessons whose
current version a policy of the same run wrote more than `max_policy_age` steps before are retired as
`expired:policy_age`.

Concurrency: a writer first takes the pool's global-cap advisory lock (only when a global cap is set), then
locks the affected problems' rows `FOR NO KEY UPDATE` in id order, so writers on the same problems queue and
cannot deadlock (writers to different pools on the same problems queue too: simple, and never wrong); each
eviction is one set-based statement that runs after the locks, on a fresh snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo.pools import PoolRow
from lanpo.db.repo.sampling import EFFECT_PRIOR_SD
from lanpo.errors import InputError


def per_step_admit(
    problem_ids: Sequence[int], rewards: Sequence[float | None], cap: int
) -> tuple[list[int], list[int]]:
    """Pure: indices admitted and dropped when at most `cap` items per problem are kept, best reward first.

    A None reward ranks below every number; equal rewards keep input order. Both lists are ascending.
    """
    by_problem: dict[int, list[int]] = defaultdict(list)
    for i, pid in enumerate(problem_ids):
        by_problem[pid].append(i)
    kept: list[int] = []
    for indices in by_problem.values():
        ordered = sorted(indices, key=lambda i: (rewards[i] is None, -(rewards[i] or 0.0), i))
        kept.extend(ordered[:cap])
    kept_set = set(kept)
    return sorted(kept_set), [i for i in range(len(problem_ids)) if i not in kept_set]


def lock_problems(session: Session, pool: PoolRow, problem_ids: Sequence[int]) -> None:
    """Take the writer locks (the pool's advisory lock if it has a global cap, then problem rows in id order)."""
    if pool.global_cap is not None:
        session.execute(sqlfiles.load("queries/lock_global_cap"), {"pool_id": pool.id})
    wanted = sorted(set(problem_ids))
    locked = set(session.scalars(sqlfiles.load("queries/lock_problems"), {"problem_ids": wanted}))
    missing = [p for p in wanted if p not in locked]
    if missing:
        raise InputError(
            f"unknown problem id{'s' if len(missing) > 1 else ''}: {', '.join(map(str, missing[:20]))}",
            hint="experiences belong to problems in the store (lanpo data import ...)",
        )


def enforce(session: Session, pool: PoolRow, problem_ids: Sequence[int]) -> list[int]:
    """Evict beyond the pool's per-problem cap of `problem_ids`, then beyond its global cap; returns evicted ids.

    Call it inside the transaction that inserted, after `lock_problems`.
    """
    # `oldest` reads its victims straight off the active-pool index; the general query ranks every candidate.
    statement = "queries/evict_per_problem_oldest" if pool.eviction == "oldest" else "queries/evict_per_problem"
    evicted = list(
        session.scalars(
            sqlfiles.load(statement),
            {
                "pool_id": pool.id,
                "problem_ids": sorted(set(problem_ids)),
                "policy": pool.eviction,
                "evicted_by": f"per_problem:{pool.eviction}",
                "cap": pool.per_problem_cap,
                "min_uses": pool.min_uses,
                "prior_sd": EFFECT_PRIOR_SD,  # lowest_utility shrinks a lift as the pools' fit does
            },
        )
    )
    if pool.global_cap is not None:
        evicted += session.scalars(
            sqlfiles.load("queries/evict_global"),
            {
                "pool_id": pool.id,
                "policy": pool.eviction,
                "evicted_by": f"global:{pool.eviction}",
                "cap": pool.global_cap,
                "min_uses": pool.min_uses,
                "prior_sd": EFFECT_PRIOR_SD,  # lowest_utility shrinks a lift as the pools' fit does
            },
        )
    return evicted


def expire(session: Session, pool: PoolRow, run_id: int, step: int) -> list[int]:
    """Retire the active lessons of `pool` too old in policy versions for run `run_id`'s step `step`; their ids.

    With `pool.max_policy_age` set, a lesson expires when its current version was written by a policy version of
    run `run_id` whose step is below `step - max_policy_age` (age = step - the policy's step > max_policy_age). In
    lanpo's loop step s is generated by the policy committed at step s - 1, so a lesson written at step s has age
    2 when step s + 1 writes. Versions written by another run's policies, or with no policy version (a hand-written
    lesson, an evaluation's), never expire: their age in this run's updates is not defined. The rows get
    `evicted_by = 'expired:policy_age'` and `evicted_run_id`, `evicted_step` = the run and step, so a resume's
    rollback of the step makes them active again. Unset `max_policy_age`: nothing, and no query.
    """
    if pool.max_policy_age is None:
        return []
    params = {"pool_id": pool.id, "run_id": run_id, "step": step, "max_policy_age": pool.max_policy_age}
    return sorted(session.scalars(sqlfiles.load("queries/experiences_expire"), params))
