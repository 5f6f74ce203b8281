"""Runs: create, look up, finish (or reopen) one, its life cycle around a body of work, and its metrics.

Policy versions and committed steps, the trainer's crash-recovery anchor, live in `lanpo.db.repo.steps`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.heartbeat import STALE_AFTER_S, Liveness, liveness, owner_tag
from lanpo.db.models import RUN_KINDS, RUN_STATUSES, Run
from lanpo.db.repo import checks
from lanpo.errors import InputError

LIST_RUNS = "list runs: lanpo runs"


def create_run(
    session: Session,
    name: str,
    kind: str,
    config: dict | None = None,
    model: str | None = None,
    pool_id: int | None = None,
    experiment_id: int | None = None,
    arm: str | None = None,
) -> Run:
    """A new run (reading and writing pool `pool_id`, if any); `name` must be unique (InputError says what to do)."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(
            "run name must be a non-empty string", hint="name the run, or leave the name out for a default"
        )
    checks.refuse_nul(name, "run name")
    if kind not in RUN_KINDS:
        raise InputError(f"run kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
    config = checks.json_object(config if config is not None else {}, "run config")
    require_name_free(session, name)
    run = Run(
        name=name,
        kind=kind,
        config=json.loads(json.dumps(config)),
        model=model,
        pool_id=pool_id,
        experiment_id=experiment_id,
        arm=arm,
    )
    session.add(run)
    session.flush()
    return run


def require_name_free(session: Session, name: str) -> None:
    """InputError when a run is already called `name` (run names are unique)."""
    if session.scalar(sa.select(Run.id).where(Run.name == name)) is not None:
        raise InputError(f"a run named {name!r} already exists", hint="choose another name, or resume that run")


def lock_name(session: Session, name: str) -> None:
    """Take run name `name`'s lock to the end of the transaction: two openers of one run take turns."""
    session.execute(sqlfiles.load("queries/lock_run_name"), {"name": name})


def find_run(session: Session, name: str) -> Run | None:
    """The run called `name`, or None."""
    return session.scalar(sa.select(Run).where(Run.name == name))


def get_run(session: Session, name: str) -> Run:
    run = find_run(session, name)
    if run is None:
        raise InputError(f"no run named {name!r}", hint=LIST_RUNS)
    return run


def free_name(session: Session, base: str) -> str:
    """`base`, or `base-2`, `base-3`, ... : the first name no run has yet."""
    name, n = base, 1
    while find_run(session, name) is not None:
        n += 1
        name = f"{base}-{n}"
    return name


def require_run(session: Session, run_id: int) -> Run:
    """The run with id `run_id`; InputError when the id is out of range or names no run."""
    checks.row_id(run_id, "run id", hint=LIST_RUNS)
    run = session.get(Run, run_id)
    if run is None:
        raise InputError(f"no run with id {run_id}", hint=LIST_RUNS)
    return run


def finish_run(session: Session, run_id: int, status: str = "finished") -> None:
    """Mark a run finished or failed (with its finish time)."""
    if status not in RUN_STATUSES or status == "running":
        raise InputError(f"a run finishes as finished or failed, got {status!r}")
    done = session.execute(sqlfiles.load("queries/run_finish"), {"status": status, "run_id": run_id}).rowcount
    if not done:
        raise InputError(f"no run with id {run_id}")


def reopen_run(session: Session, run_id: int) -> None:
    """A resumed run is running again (its finish time cleared)."""
    if not session.execute(sqlfiles.load("queries/run_reopen"), {"run_id": run_id}).rowcount:
        raise InputError(f"no run with id {run_id}")


@contextmanager
def run_lifecycle(db: Engine, run_id: int | None) -> Iterator[None]:
    """The work of run `run_id` (None: nothing is recorded): this process holds the run and beats while the body
    runs (`lanpo.db.heartbeat`); it is marked failed if the body raises (Ctrl-C too), finished if it returns. Each
    mark is its own transaction, so a failure inside the body cannot undo it. (A SIGKILL leaves the run `running`
    with a heartbeat that stops: `lanpo runs` shows it stale.)"""
    from lanpo.db.connection import transaction
    from lanpo.db.heartbeat import Heartbeat

    try:
        with Heartbeat(db, run_id) if run_id is not None else nullcontext():
            yield
    except BaseException:
        if run_id is not None:
            with transaction(db) as session:
                finish_run(session, run_id, "failed")
        raise
    if run_id is not None:
        with transaction(db) as session:
            finish_run(session, run_id, "finished")


@dataclass(frozen=True)
class RunRow:
    """A run as `lanpo runs` lists it: what it is, how far it got, and what its heartbeat says."""

    id: int
    name: str
    kind: str
    status: str
    model: str | None
    owner: str | None
    last_step: int | None
    started_at: datetime
    finished_at: datetime | None
    heartbeat_age_s: float | None  # seconds since its last beat, by the database's clock

    def liveness(self, stale_after_s: float = STALE_AFTER_S) -> Liveness:
        return liveness(self.status, self.owner, self.heartbeat_age_s, stale_after_s)


def list_runs(session: Session, names: Sequence[str] = ()) -> list[RunRow]:
    """Every run (or those named), oldest first, with its last committed step and heartbeat age."""
    rows = session.execute(sqlfiles.load("queries/runs_list"), {"names": list(names) or None}).all()
    return [RunRow(**row._mapping) for row in rows]


def require_lost(session: Session, run: Run, action: str) -> None:
    """InputError unless running run `run` lost its process (stale or dead): `action` would race a live owner."""
    [row] = list_runs(session, [run.name])
    state = row.liveness()
    if state.state == "alive" and row.owner != owner_tag():  # (this process may take back what it held)
        raise InputError(
            f"run {run.name!r} is still running: {state.why}",
            hint=f"stop that process first; a run whose process died can be {action} once its heartbeat is "
            f"{STALE_AFTER_S:.0f} s old, or at once on the machine it ran on",
        )


def has_metric_prefix(session: Session, run_id: int, step: int, prefix: str) -> bool:
    """Whether (run, step) has a metric named `prefix...`."""
    return bool(
        session.scalar(
            sqlfiles.load("queries/run_metric_prefix_exists"), {"run_id": run_id, "step": step, "prefix": prefix}
        )
    )


def record_metrics(session: Session, run_id: int, step: int, metrics: dict[str, float]) -> None:
    """Upsert `name -> value` for (run, step); values are numbers (NaN kept: a NaN loss is worth seeing) or None."""
    if not isinstance(metrics, dict):
        raise InputError(f"metrics must be a dict, got {type(metrics).__name__}")
    rows = []
    for name, value in metrics.items():
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"metric names must be non-empty strings, got {name!r}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InputError(f"metric {name} must be a number or None, got {type(value).__name__} ({value!r})")
        rows.append({"run_id": run_id, "step": step, "name": name, "value": None if value is None else float(value)})
    if rows:
        session.execute(sqlfiles.load("queries/run_metric_upsert"), rows)
