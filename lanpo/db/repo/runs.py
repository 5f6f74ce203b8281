"""Runs, policy versions, metrics and committed steps (the trainer's crash-recovery anchor)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db.models import RUN_KINDS, RUN_STATUSES, Run
from lanpo.db.repo import checks
from lanpo.errors import InputError


def create_run(session: Session, name: str, kind: str, config: dict | None = None, model: str | None = None) -> Run:
    """A new run; `name` must be unique (InputError says how to resume or rename)."""
    if not isinstance(name, str) or not name.strip():
        raise InputError("run name must be a non-empty string")
    checks.refuse_nul(name, "run name")
    if kind not in RUN_KINDS:
        raise InputError(f"run kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
    config = checks.json_object(config if config is not None else {}, "run config")
    if session.scalar(sa.select(Run.id).where(Run.name == name)) is not None:
        raise InputError(f"a run named {name!r} already exists", hint="choose another name, or resume that run")
    run = Run(name=name, kind=kind, config=json.loads(json.dumps(config)), model=model)
    session.add(run)
    session.flush()
    return run


def get_run(session: Session, name: str) -> Run:
    run = session.scalar(sa.select(Run).where(Run.name == name))
    if run is None:
        raise InputError(f"no run named {name!r}", hint='list runs: lanpo sql "SELECT id, name, status FROM runs"')
    return run


def finish_run(session: Session, run_id: int, status: str = "finished") -> None:
    if status not in RUN_STATUSES:
        raise InputError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
    done = session.execute(
        sa.text(
            "UPDATE runs SET status = :s, finished_at = CASE WHEN :s = 'running' THEN NULL ELSE now() END "
            "WHERE id = :id"
        ),
        {"s": status, "id": run_id},
    ).rowcount
    if not done:
        raise InputError(f"no run with id {run_id}")


def add_policy_version(session: Session, run_id: int, step: int, adapter_sha256: str) -> int:
    """Record which adapter produced rows at `step`; returns its id (the same id if already recorded)."""
    if not re.fullmatch(r"[0-9a-f]{64}", adapter_sha256 or ""):
        raise InputError(f"adapter_sha256 must be 64 lowercase hex digits, got {adapter_sha256!r}")
    checks.int_or_none(step, "step", minimum=0)
    row = session.execute(
        sa.text(
            "INSERT INTO policy_versions (run_id, step, adapter_sha256) VALUES (:r, :s, :h) "
            "ON CONFLICT (run_id, step) DO UPDATE SET adapter_sha256 = policy_versions.adapter_sha256 "
            "RETURNING id, adapter_sha256"
        ),
        {"r": run_id, "s": step, "h": adapter_sha256},
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
        rows.append({"r": run_id, "s": step, "n": name, "v": None if value is None else float(value)})
    if rows:
        session.execute(
            sa.text(
                "INSERT INTO run_metrics (run_id, step, name, value) VALUES (:r, :s, :n, :v) "
                "ON CONFLICT (run_id, step, name) DO UPDATE SET value = EXCLUDED.value"
            ),
            rows,
        )


def commit_step(
    session: Session, run_id: int, step: int, policy_version_id: int | None = None, checkpoint: str | None = None
) -> None:
    """Mark `step` committed (call it LAST inside the step's transaction); a step commits once."""
    if session.scalar(sa.text("SELECT 1 FROM run_steps WHERE run_id = :r AND step = :s"), {"r": run_id, "s": step}):
        raise InputError(f"run {run_id} step {step} is already committed")
    session.execute(
        sa.text("INSERT INTO run_steps (run_id, step, policy_version_id, checkpoint) VALUES (:r, :s, :p, :c)"),
        {"r": run_id, "s": step, "p": policy_version_id, "c": checkpoint},
    )


def last_committed_step(session: Session, run_id: int) -> int | None:
    return session.scalar(sa.text("SELECT max(step) FROM run_steps WHERE run_id = :r"), {"r": run_id})


@dataclass
class RollbackResult:
    attempts: int
    experiences: int
    metrics: int
    policy_versions: int
    steps: int


def rollback_uncommitted(session: Session, run_id: int, after_step: int | None) -> RollbackResult:
    """Delete the run's rows of steps > `after_step` (None: every step), for resuming after a crash.

    Evictions that a rolled-back step made are not undone (the eviction record does not name the step);
    with one transaction per step nothing of an uncommitted step reaches the database in the first place.
    """
    p = {"r": run_id, "s": -1 if after_step is None else after_step}
    attempts = session.execute(sa.text("DELETE FROM attempts WHERE run_id = :r AND step > :s"), p).rowcount
    experiences = session.execute(sa.text("DELETE FROM experiences WHERE run_id = :r AND step > :s"), p).rowcount
    metrics = session.execute(sa.text("DELETE FROM run_metrics WHERE run_id = :r AND step > :s"), p).rowcount
    steps = session.execute(sa.text("DELETE FROM run_steps WHERE run_id = :r AND step > :s"), p).rowcount
    versions = session.execute(
        sa.text(
            "DELETE FROM policy_versions pv WHERE pv.run_id = :r AND pv.step > :s "
            "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.policy_version_id = pv.id) "
            "AND NOT EXISTS (SELECT 1 FROM experience_versions v WHERE v.policy_version_id = pv.id)"
        ),
        p,
    ).rowcount
    return RollbackResult(attempts, experiences, metrics, versions, steps)
