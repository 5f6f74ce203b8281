"""Capacity policies of the experience pool, enforced inside the inserting transaction.

Three caps (StoreConfig): per step (new experiences per problem admitted by one `add_experiences` call,
best reward first, the rest dropped and reported), per problem (active experiences kept per problem) and
an optional global cap (active experiences in the whole pool). When a cap is exceeded the eviction policy
picks who leaves: `oldest`, `lowest_reward` (NULL rewards first) or `lowest_relevance` (relevance of an
experience = mean score of the relevance_scores rows naming one of its versions, else of the rows naming
its problem as the candidate, else 0). Ties fall back to age. Evicted rows get `evicted_at = now()` and
`evicted_by = '<scope>:<policy>'` (scope: per_problem | global) and stay in history.

Concurrency: a writer first takes the global advisory lock (only when a global cap is set), then locks the
affected problems' rows `FOR NO KEY UPDATE` in id order, so writers on the same problems queue and cannot
deadlock; each eviction is one set-based statement that runs after the locks, on a fresh snapshot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db import sqlfiles
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


def lock_problems(session: Session, problem_ids: Sequence[int], store: StoreConfig) -> None:
    """Take the writer locks (global advisory lock if a global cap is set, then problem rows in id order)."""
    if store.global_cap is not None:
        session.execute(sqlfiles.load("queries/lock_global_cap"))
    wanted = sorted(set(problem_ids))
    locked = set(session.scalars(sqlfiles.load("queries/lock_problems"), {"problem_ids": wanted}))
    missing = [p for p in wanted if p not in locked]
    if missing:
        raise InputError(
            f"unknown problem id{'s' if len(missing) > 1 else ''}: {', '.join(map(str, missing[:20]))}",
            hint="experiences belong to problems in the store (lanpo data import ...)",
        )


def enforce(session: Session, problem_ids: Sequence[int], store: StoreConfig) -> list[int]:
    """Evict beyond the per-problem cap of `problem_ids`, then beyond the global cap; returns evicted ids.

    Call it inside the transaction that inserted, after `lock_problems`.
    """
    evicted = list(
        session.scalars(
            sqlfiles.load("queries/evict_per_problem"),
            {
                "problem_ids": sorted(set(problem_ids)),
                "policy": store.eviction,
                "evicted_by": f"per_problem:{store.eviction}",
                "cap": store.per_problem_cap,
            },
        )
    )
    if store.global_cap is not None:
        evicted += session.scalars(
            sqlfiles.load("queries/evict_global"),
            {"policy": store.eviction, "evicted_by": f"global:{store.eviction}", "cap": store.global_cap},
        )
    return evicted
