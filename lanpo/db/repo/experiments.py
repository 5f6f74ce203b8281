"""Experiments: named sets of runs compared on purpose (arms x seeds sharing a start, problems and steps)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo import checks
from lanpo.errors import InputError


@dataclass(frozen=True)
class ExperimentRow:
    id: int
    name: str
    config: dict[str, Any]
    status: str


def _row(r: Any) -> ExperimentRow:
    return ExperimentRow(int(r.id), r.name, dict(r.config or {}), r.status)


def find_experiment(session: Session, name: str) -> ExperimentRow | None:
    found = session.execute(sqlfiles.load("queries/experiment_get"), {"name": name}).one_or_none()
    return None if found is None else _row(found)


def get_experiment(session: Session, name: str) -> ExperimentRow:
    found = find_experiment(session, name)
    if found is None:
        raise InputError(f"no experiment named {name!r}", hint="lanpo experiment --config FILE starts one")
    return found


def ensure_experiment(
    session: Session,
    name: str,
    config: dict[str, Any],
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] = lambda stored: stored,
) -> ExperimentRow:
    """The experiment `name`, created with `config` when new; an existing one must have been made with the same
    (its stored config compared after `upgrade`, which reads it through today's schema)."""
    if not isinstance(name, str) or not name.strip():
        raise InputError("an experiment name must be a non-empty string")
    checks.refuse_nul(name, "experiment name")
    config = json.loads(json.dumps(checks.json_object(config, "experiment config")))
    session.execute(sqlfiles.load("queries/experiment_insert"), {"name": name, "config": json.dumps(config)})
    found = get_experiment(session, name)
    if found.config != config and json.loads(json.dumps(upgrade(found.config))) != config:
        raise InputError(
            f"an experiment named {name!r} exists with another configuration",
            hint="give this one another name, or run the existing one with its own config",
        )
    return found


def set_status(session: Session, experiment_id: int, status: str) -> None:
    if status not in ("running", "finished", "failed"):
        raise InputError(f"an experiment is running, finished or failed, got {status!r}")
    session.execute(sqlfiles.load("queries/experiment_status"), {"id": experiment_id, "status": status})
