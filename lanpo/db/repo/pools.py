"""Named experience pools: create one with its capacity settings, look one up by name, list them.

A run reads from and writes to one pool (`runs.pool_id`); by default a pool named after the run, so the runs of an
ablation never feed each other. Sharing a pool is a decision (`store.pool = "NAME"` in each run's config), and a
run that joins an existing pool must ask for the capacity settings the pool was created with: a pool's caps never
change silently under the runs that use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db import sqlfiles
from lanpo.db.repo import checks
from lanpo.errors import InputError, listing

# a pool's settings, as named in [store] and in the pools table
SETTINGS = (
    "per_problem_cap",
    "per_step_cap",
    "global_cap",
    "eviction",
    "min_uses",
    "merge_threshold",
    "merge_keeps",
    "max_policy_age",
    "baseline_half_life",
    "baseline_prior",
    "retire_below",
)


@dataclass(frozen=True)
class PoolRow:
    """A pool and its capacity settings (see `lanpo.db.repo.capacity`)."""

    id: int
    name: str
    per_problem_cap: int
    per_step_cap: int
    global_cap: int | None
    eviction: str
    created_at: datetime
    min_uses: int = 4
    merge_threshold: float | None = None
    merge_keeps: str = "newer"
    max_policy_age: int | None = None
    baseline_half_life: float = 2.0
    baseline_prior: float = 2.0
    retire_below: float | None = None

    def settings(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in SETTINGS}

    @property
    def merges(self) -> bool:
        """Whether a near-duplicate lesson becomes a new version of the one it repeats (`store.merge_threshold`)."""
        return self.merge_threshold is not None


@dataclass(frozen=True)
class PoolSummary:
    """A pool with its size and the runs that use it (`lanpo pool list`)."""

    pool: PoolRow
    active: int
    evicted: int
    runs: str


def check_pool_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InputError("a pool name must be a non-empty string", hint="`lanpo pool list` names the pools")
    checks.refuse_nul(name, "pool name")
    return name


def _row(r: object) -> PoolRow:
    return PoolRow(r.id, r.name, r.per_problem_cap, r.per_step_cap, r.global_cap, r.eviction, r.created_at,  # type: ignore[attr-defined]
                   r.min_uses, r.merge_threshold, r.merge_keeps, r.max_policy_age,  # type: ignore[attr-defined]
                   r.baseline_half_life, r.baseline_prior, r.retire_below)  # type: ignore[attr-defined]  # fmt: skip


def find_pool(session: Session, name: str) -> PoolRow | None:
    found = session.execute(sqlfiles.load("queries/pool_get"), {"name": check_pool_name(name)}).one_or_none()
    return None if found is None else _row(found)


def pool_names(session: Session) -> list[str]:
    return [s.pool.name for s in list_pools(session)]


def _unknown(session: Session, name: str) -> InputError:
    names = pool_names(session)
    return InputError(
        f"no pool named {name!r}",
        hint=f"pools in the store: {listing(names, every='lanpo pool list')}"
        if names
        else "the store has no pool yet (train a run first)",
    )


def get_pool(session: Session, name: str) -> PoolRow:
    """The pool `name`; InputError listing the pools there are."""
    found = find_pool(session, name)
    if found is None:
        raise _unknown(session, name)
    return found


def ensure_pool(session: Session, name: str, store: StoreConfig) -> PoolRow:
    """The pool `name`, created with `store`'s capacity settings when new; an existing pool must have the same."""
    wanted = {name: getattr(store, name) for name in SETTINGS}
    session.execute(sqlfiles.load("queries/pool_insert"), {"name": check_pool_name(name), **wanted})
    pool = get_pool(session, name)
    differ = {k: (v, wanted[k]) for k, v in pool.settings().items() if v != wanted[k]}
    if differ:
        shown = ", ".join(f"{k} = {have!r} (config: {want!r})" for k, (have, want) in differ.items())
        raise InputError(
            f"pool {name!r} exists with other capacity settings: {shown}",
            hint="use the pool's settings in [store], or another pool (store.pool = NAME)",
        )
    return pool


def resolve_pool(session: Session, name: str | None) -> PoolRow:
    """`name`'s pool; with no name, the only pool there is (InputError when there are none or several)."""
    if name is not None:
        return get_pool(session, name)
    names = pool_names(session)
    if len(names) == 1:
        return get_pool(session, names[0])
    if not names:
        raise InputError("the store has no experience pool yet", hint="train a run first (lanpo train)")
    raise InputError(
        f"the store holds {len(names)} pools; say which one to use",
        hint=f"pass --pool NAME, one of: {listing(names, every='lanpo pool list')}",
    )


def list_pools(session: Session) -> list[PoolSummary]:
    """Every pool, oldest first, with active / evicted counts and its runs."""
    return [
        PoolSummary(_row(r), int(r.active), int(r.evicted), r.runs)
        for r in session.execute(sqlfiles.load("queries/pool_list"))
    ]


def active_size(session: Session, pool_id: int) -> int:
    """Active (not evicted) experiences of one pool."""
    return int(session.scalar(sqlfiles.load("queries/pool_active_size"), {"pool_id": pool_id}))


def other_model(session: Session, pool_name: str, model: str) -> str | None:
    """A model other than `model` whose runs wrote lessons into pool `pool_name` (None: none did)."""
    return session.scalar(sqlfiles.load("queries/pool_other_model"), {"pool": pool_name, "model": model})
