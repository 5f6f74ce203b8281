"""Runs, policy versions, metrics and committed steps (the trainer's crash-recovery anchor)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models import RUN_KINDS, RUN_STATUSES, Run
from lanpo.db.repo import checks
from lanpo.errors import InputError

LIST_RUNS = 'list runs: lanpo sql "SELECT id, name, kind, status FROM runs ORDER BY id"'


def create_run(
    session: Session,
    name: str,
    kind: str,
    config: dict | None = None,
    model: str | None = None,
    pool_id: int | None = None,
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
    run = Run(name=name, kind=kind, config=json.loads(json.dumps(config)), model=model, pool_id=pool_id)
    session.add(run)
    session.flush()
    return run


def require_name_free(session: Session, name: str) -> None:
    """InputError when a run is already called `name` (run names are unique)."""
    if session.scalar(sa.select(Run.id).where(Run.name == name)) is not None:
        raise InputError(f"a run named {name!r} already exists", hint="choose another name, or resume that run")


def get_run(session: Session, name: str) -> Run:
    run = session.scalar(sa.select(Run).where(Run.name == name))
    if run is None:
        raise InputError(f"no run named {name!r}", hint=LIST_RUNS)
    return run


def require_run(session: Session, run_id: int) -> Run:
    """The run with id `run_id`; InputError when the id is out of range or names no run."""
    checks.row_id(run_id, "run id", hint=LIST_RUNS)
    run = session.get(Run, run_id)
    if run is None:
        raise InputError(f"no run with id {run_id}", hint=LIST_RUNS)
    return run


def finish_run(session: Session, run_id: int, status: str = "finished") -> None:
    if status not in RUN_STATUSES:
        raise InputError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
    done = session.execute(sqlfiles.load("queries/run_finish"), {"status": status, "run_id": run_id}).rowcount
    if not done:
        raise InputError(f"no run with id {run_id}")


def add_policy_version(session: Session, run_id: int, step: int, adapter_sha256: str) -> int:
    """Record which adapter produced rows at `step`; returns its id (the same id if already recorded)."""
    if not re.fullmatch(r"[0-9a-f]{64}", adapter_sha256 or ""):
        raise InputError(f"adapter_sha256 must be 64 lowercase hex digits, got {adapter_sha256!r}")
    checks.int_or_none(step, "step", minimum=0)
    row = session.execute(
        sqlfiles.load("queries/policy_version_upsert"),
        {"run_id": run_id, "step": step, "adapter_sha256": adapter_sha256},
    ).one()
    if row.adapter_sha256 != adapter_sha256:
        raise InputError(
            f"run {run_id} step {step} is already recorded with adapter {row.adapter_sha256[:12]}..., "
            f"not {adapter_sha256[:12]}..."
        )
    return int(row.id)


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


def commit_step(
    session: Session, run_id: int, step: int, policy_version_id: int | None = None, checkpoint: str | None = None
) -> None:
    """Mark `step` committed (call it LAST inside the step's transaction); a step commits once."""
    if session.scalar(sqlfiles.load("queries/run_step_exists"), {"run_id": run_id, "step": step}):
        raise InputError(f"run {run_id} step {step} is already committed")
    session.execute(
        sqlfiles.load("queries/run_step_commit"),
        {"run_id": run_id, "step": step, "policy_version_id": policy_version_id, "checkpoint": checkpoint},
    )


def last_committed_step(session: Session, run_id: int) -> int | None:
    return session.scalar(sqlfiles.load("queries/run_last_committed_step"), {"run_id": run_id})


@dataclass
class RollbackResult:
    groups: int  # rollout groups (their attempts and contexts went with them)
    experiences: int
    metrics: int
    steps: int
    policy_versions: int


def rollback_uncommitted(session: Session, run_id: int, after_step: int | None) -> RollbackResult:
    """Delete the run's rows of steps > `after_step` (None: every step), for resuming after a crash.

    Evictions that a rolled-back step made are not undone (the eviction record does not name the step);
    with one transaction per step nothing of an uncommitted step reaches the database in the first place.
    """
    p = {"run_id": run_id, "after_step": -1 if after_step is None else after_step}
    counts = {
        name: session.execute(sqlfiles.load(f"queries/rollback_{name}"), p).rowcount
        for name in ("groups", "experiences", "metrics", "steps", "policy_versions")  # order matters: FKs
    }
    return RollbackResult(**counts)
