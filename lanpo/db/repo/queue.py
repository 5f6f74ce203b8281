"""The rollout queue (migration 0012): the trainer queues a step's prompts, workers claim, generate and finish it.

    trainer: enqueue(step, prompts) ... finished(step) -> train -> mark(used) in the step's commit
    worker:  claim() -> renew() every few seconds while it generates -> finish(groups) | requeue()

A claim is a lease: a worker that stops renewing it (killed, its machine gone) loses it when `lease_until` passes,
and the next claim takes the row again (`claims` counts the takes). Only the holder of a row's current
`claim_token` can renew or finish it, and a row's result is written once (its key is the row's), so a worker that
lost its lease cannot add a second result or overwrite the redone one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles


@dataclass(frozen=True)
class Claim:
    """Work a worker holds: step `step`'s prompts, to generate with at least the policy of `min_policy_step`."""

    id: int
    step: int
    attempt: int
    prompts: dict[str, Any]
    min_policy_step: int
    token: str
    claims: int  # takes so far, this one included: above 1, the claim is redone


@dataclass(frozen=True)
class Finished:
    """Finished work of a step, not used nor dropped yet: its groups and the policy step that generated them."""

    id: int
    attempt: int
    claims: int
    prompts: dict[str, Any]
    policy_step: int
    served_sha256: str | None
    worker: str
    groups: list[dict[str, Any]]
    seconds: dict[str, float]


@dataclass(frozen=True)
class QueueState:
    queued: int
    claimed: int
    lapsed: int  # claimed under a lease that ran out: the next claim redoes it
    done: int
    redone: int  # claims of the step asked about taken again after a lease ran out


def enqueue(session: Session, run_id: int, step: int, prompts: dict[str, Any], min_policy_step: int) -> int | None:
    """Queue `step` (its next attempt) unless a live attempt is queued, claimed or finished; returns the row's id,
    None when the step was queued before."""
    return session.scalar(
        sqlfiles.load("queries/rollout_work_enqueue"),
        {"run_id": run_id, "step": step, "prompts": json.dumps(prompts), "min_policy_step": min_policy_step},
    )


def claim(session: Session, run_id: int, worker: str, lease_s: float) -> Claim | None:
    """The oldest open work of the run, now held by `worker` for `lease_s` seconds (None: nothing open)."""
    row = session.execute(
        sqlfiles.load("queries/rollout_work_claim"), {"run_id": run_id, "worker": worker, "lease_s": lease_s}
    ).one_or_none()
    if row is None:
        return None
    return Claim(row.id, row.step, row.attempt, row.prompts, row.min_policy_step, row.claim_token, row.claims)


def renew(session: Session, claim: Claim, lease_s: float) -> bool:
    """Extend the lease; False when the claim was lost (the lease ran out and another worker took the row)."""
    found = session.scalar(
        sqlfiles.load("queries/rollout_work_renew"), {"id": claim.id, "token": claim.token, "lease_s": lease_s}
    )
    return found is not None


def finish(
    session: Session,
    claim: Claim,
    worker: str,
    policy_step: int,
    served_sha256: str | None,
    groups: list[dict[str, Any]],
    seconds: dict[str, float],
) -> bool:
    """Mark the work done with its groups, in the caller's transaction; False (nothing written) when the claim
    was lost: then the row belongs to a redone claim, whose result is the one kept."""
    if session.scalar(sqlfiles.load("queries/rollout_work_finish"), {"id": claim.id, "token": claim.token}) is None:
        return False
    session.execute(
        sqlfiles.load("queries/rollout_result_insert"),
        {
            "work_id": claim.id,
            "policy_step": policy_step,
            "served_sha256": served_sha256,
            "worker": worker,
            "groups": json.dumps(groups),
            "seconds": json.dumps(seconds),
        },
    )
    return True


def requeue(session: Session, claim: Claim) -> bool:
    """Give the work back at once (the worker cannot serve it, or stops); False when the claim was lost already."""
    found = session.scalar(sqlfiles.load("queries/rollout_work_requeue"), {"id": claim.id, "token": claim.token})
    return found is not None


def finished(session: Session, run_id: int, step: int) -> Finished | None:
    """The newest finished attempt of `step` the trainer has not used nor dropped (None: not finished yet)."""
    row = session.execute(
        sqlfiles.load("queries/rollout_work_finished"), {"run_id": run_id, "step": step}
    ).one_or_none()
    if row is None:
        return None
    return Finished(
        row.id,
        row.attempt,
        row.claims,
        row.prompts,
        row.policy_step,
        row.served_sha256,
        row.worker,
        row.groups,
        row.seconds,
    )


def mark(session: Session, work_id: int, status: str) -> None:
    """The trainer's verdict on finished work: `used` (in the transaction that commits its step) or `dropped`."""
    if status not in ("used", "dropped"):
        raise ValueError(f"finished work is used or dropped, not {status!r}")
    if session.scalar(sqlfiles.load("queries/rollout_work_mark"), {"id": work_id, "status": status}) is None:
        raise RuntimeError(f"rollout work {work_id} is not finished work waiting for the trainer")


def state(session: Session, run_id: int, step: int) -> QueueState:
    row = session.execute(sqlfiles.load("queries/rollout_work_state"), {"run_id": run_id, "step": step}).one()
    return QueueState(int(row.queued), int(row.claimed), int(row.lapsed), int(row.done), int(row.redone))


@dataclass(frozen=True)
class WorkerState:
    """One worker of a run as the queue sees it (`lanpo runs workers`)."""

    run: str
    worker: str
    holding: int | None  # the step it holds a claim on (None: idle, or gone)
    lease_left_s: float | None  # negative: the lease ran out, and the next claim redoes the step
    finished: int
    last_finished_age_s: float | None


def workers(session: Session, names: list[str] | None = None) -> list[WorkerState]:
    """Every worker that holds a claim or finished a step, of every run or of the runs named, oldest run first."""
    rows = session.execute(sqlfiles.load("queries/rollout_workers"), {"names": names})
    return [
        WorkerState(r.run, r.worker, r.holding, r.lease_left_s, int(r.finished), r.last_finished_age_s) for r in rows
    ]


@dataclass(frozen=True)
class PublishedPolicy:
    """The newest committed step of a run: the version workers serve, where its weights are, and their hash."""

    step: int
    checkpoint: str | None
    adapter_sha256: str
    served_sha256: str | None


def newest_policy(session: Session, run_id: int) -> PublishedPolicy | None:
    row = session.execute(sqlfiles.load("queries/rollout_newest_policy"), {"run_id": run_id}).one_or_none()
    if row is None:
        return None
    return PublishedPolicy(int(row.step), row.checkpoint, row.adapter_sha256, row.served_sha256)


def live_steps(session: Session, run_id: int, first: int, last: int) -> set[int]:
    """The steps in [first, last] queued already (a live attempt: queued, claimed, done or used)."""
    rows = session.scalars(
        sqlfiles.load("queries/rollout_work_live_steps"), {"run_id": run_id, "first": first, "last": last}
    )
    return {int(s) for s in rows}
