"""Policy versions and committed steps: which weights produced a row, and the trainer's crash-recovery anchor.

A training step's transaction records its policy version and, last, its `run_steps` row; resume continues after
the last checkpointed step (every committed step, with `checkpoint.every = 1`) and deletes anything newer, undoing
the evictions it made (`rollback_uncommitted`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo import checks, usefulness
from lanpo.errors import InputError

log = logging.getLogger(__name__)


def _check_sha256(value: str | None, what: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{64}", value or ""):
        raise InputError(f"{what} must be 64 lowercase hex digits, got {value!r}")


def add_policy_version(session: Session, run_id: int, step: int, adapter_sha256: str) -> int:
    """Record which adapter produced rows at `step`; returns its id (the same id if already recorded)."""
    _check_sha256(adapter_sha256, "adapter_sha256")
    checks.int_or_none(step, "step", minimum=0)
    params = {"run_id": run_id, "step": step, "adapter_sha256": adapter_sha256}
    row = session.execute(sqlfiles.load("queries/policy_version_upsert"), params).one_or_none()
    if row is None:  # recorded already (by a concurrent writer too: this statement sees its commit)
        row = session.execute(sqlfiles.load("queries/policy_version_get"), params).one()
    if row.adapter_sha256 != adapter_sha256:
        raise InputError(
            f"run {run_id} step {step} is already recorded with adapter {row.adapter_sha256[:12]}..., "
            f"not {adapter_sha256[:12]}..."
        )
    return int(row.id)


def set_served(session: Session, policy_version_id: int, served_sha256: str | None) -> None:
    """Record that the vLLM engine served `served_sha256` for a policy version (merged LoRA); a version's own
    hash, or None, records nothing. A version already tied to other served weights keeps them, with a warning:
    merged weights are recomputed on resume, and on another machine their rounding may differ."""
    if served_sha256 is None:
        return
    _check_sha256(served_sha256, "served_sha256")
    stored = session.scalar(
        sqlfiles.load("queries/policy_version_served"), {"id": policy_version_id, "served": served_sha256}
    )
    if stored is not None and stored != served_sha256:
        log.warning(
            "policy version %s was served as %s..., now as %s...: its rollouts from now on carry the new hash",
            policy_version_id,
            stored[:12],
            served_sha256[:12],
        )


def policy_version_id(session: Session, run_id: int, step: int) -> int:
    """The id of run `run_id`'s policy version at `step`; InputError when it was never recorded."""
    found = session.scalar(sqlfiles.load("queries/policy_version_id"), {"run_id": run_id, "step": step})
    if found is None:
        raise InputError(f"run {run_id} has no policy version for step {step}")
    return int(found)


def commit_step(
    session: Session, run_id: int, step: int, policy_version_id: int | None = None, checkpoint: str | None = None
) -> None:
    """Mark `step` committed (call it LAST inside the step's transaction); a step commits once."""
    if is_committed(session, run_id, step):
        raise InputError(f"run {run_id} step {step} is already committed")
    session.execute(
        sqlfiles.load("queries/run_step_commit"),
        {"run_id": run_id, "step": step, "policy_version_id": policy_version_id, "checkpoint": checkpoint},
    )


def set_checkpoint(session: Session, run_id: int, step: int, checkpoint: str) -> bool:
    """Name the checkpoint folder of committed `step` (a trainer whose checkpoint follows its commit); False when
    the step made no rows (a TRL step that reused the last generation)."""
    params = {"run_id": run_id, "step": step, "checkpoint": checkpoint}
    return bool(session.execute(sqlfiles.load("queries/run_step_set_checkpoint"), params).rowcount)


def is_committed(session: Session, run_id: int, step: int) -> bool:
    return bool(session.scalar(sqlfiles.load("queries/run_step_exists"), {"run_id": run_id, "step": step}))


def last_committed_step(session: Session, run_id: int) -> int | None:
    return session.scalar(sqlfiles.load("queries/run_last_committed_step"), {"run_id": run_id})


def last_group_step(session: Session, run_id: int) -> int | None:
    """The newest step the run wrote groups for, committed or not (None: none)."""
    return session.scalar(sqlfiles.load("queries/run_last_group_step"), {"run_id": run_id})


def uncommitted_steps(session: Session, run_id: int, before: int) -> list[int]:
    """The steps before `before` whose groups are written and which are not committed, oldest first."""
    params = {"run_id": run_id, "before": before}
    return [int(s) for s in session.scalars(sqlfiles.load("queries/run_uncommitted_steps"), params)]


def lock_step(session: Session, run_id: int, step: int) -> None:
    """Take (run, step)'s write lock to the end of the transaction: the step's writers take turns."""
    session.execute(sqlfiles.load("queries/lock_run_step"), {"run_id": run_id, "step": step})


def step_lessons(session: Session, run_id: int, step: int) -> int:
    """How many lessons (experiences) step `step` of the run has added so far."""
    return int(session.scalar(sqlfiles.load("queries/step_lessons_count"), {"run_id": run_id, "step": step}) or 0)


def step_rollout_metrics(session: Session, run_id: int, step: int, trained: bool = False) -> dict[str, float]:
    """A step's rollout metrics read back from its rows (its groups written one by one or in batches); `trained`:
    over the groups the step trained (`consumed_step`), which earlier steps may have written."""
    params = {"run_id": run_id, "step": step, "trained": trained}
    row = session.execute(sqlfiles.load("queries/step_rollout_metrics"), params).one()
    return {
        "reward/mean": float(row.reward or 0.0),
        "accuracy/mean": float(row.accuracy or 0.0),
        "format/headers": float(row.format or 0.0),
        "response_len/mean": float(row.length or 0.0),
        "count/zero_shot": float(row.zero_shot),
        "count/intra": float(row.intra),
        "count/inter": float(row.inter),
        "pool/added": float(row.added or 0),
    }


def newest_versions(session: Session, run_id: int, count: int) -> list[str]:
    """The hashes of the policy versions the newest `count` committed steps name, newest first."""
    return list(session.scalars(sqlfiles.load("queries/run_newest_versions"), {"run_id": run_id, "count": count}))


@dataclass(frozen=True)
class CommittedStep:
    """What the database says about a committed step: its checkpoint folder and the adapter it holds."""

    step: int
    checkpoint: str | None
    adapter_sha256: str | None


def committed_step(session: Session, run_id: int, step: int) -> CommittedStep:
    found = find_committed_step(session, run_id, step)
    if found is None:
        raise InputError(f"run {run_id} has no committed step {step}")
    return found


def find_committed_step(session: Session, run_id: int, step: int) -> CommittedStep | None:
    """Committed step `step` of the run, or None (never committed, or a step that made no rows)."""
    row = session.execute(sqlfiles.load("queries/run_step_state"), {"run_id": run_id, "step": step}).one_or_none()
    return None if row is None else CommittedStep(step, row.checkpoint, row.adapter_sha256)


def last_checkpointed_step(session: Session, run_id: int) -> int | None:
    """The run's last committed step that names a checkpoint (`checkpoint.every` > 1 commits steps without one)."""
    return session.scalar(sqlfiles.load("queries/run_last_checkpointed_step"), {"run_id": run_id})


@dataclass
class RollbackResult:
    groups: int  # rollout groups (their attempts and contexts went with them)
    experiences: int
    metrics: int
    steps: int
    policy_versions: int
    attempts: int = 0  # the groups' attempts
    evictions: int = 0  # experiences the rolled-back steps evicted, active again
    meta_nll_uses: int = 0
    work: int = 0  # rollout_work rows (their results went with them)
    versions: int = 0  # versions the rolled-back steps merged into older lessons
    fates: int = 0  # groups of earlier steps whose later consumption (trained, dropped) was undone

    def line(self, after_step: int, last_step: int) -> str:
        """What a resume prints: the checkpointed step it continues from and what it undid of the steps after."""
        steps = f"step {after_step + 1}" if last_step == after_step + 1 else f"steps {after_step + 1}..{last_step}"
        return (
            f"resumed from step {after_step}; rolled back {steps}: {self.attempts} attempts, {self.experiences} "
            f"experiences, {self.evictions} evictions undone"
        )


def rollback_uncommitted(session: Session, run_id: int, after_step: int | None) -> RollbackResult:
    """Delete the run's rows of steps > `after_step` (None: every step) and undo their evictions, in the caller's
    transaction: for resuming after a crash, from the last committed step or (`checkpoint.every` > 1) from the last
    checkpointed one, before which committed steps roll back too.

    Rolled back: the steps' rollout groups (attempts, contexts, MEL replays and pairs cascade), the versions they
    merged into older lessons, experiences (versions and their relevance scores cascade), MEL NLL uses, metrics,
    `run_steps` rows, the policy versions nothing refers to any more, and, when committed steps go, the rollout
    work queued for them; the experiences those steps evicted (`evicted_run_id`, `evicted_step`: migration 0013)
    are active again. So the pool is the one step `after_step` left. Not rolled back: relevance scores of
    surviving experiences that later steps computed (a cache of a pure function of the texts), and what other runs
    writing the same pool did meanwhile. The `lesson_usefulness` of the versions the deleted groups used is
    recomputed without them.
    """
    p = {"run_id": run_id, "after_step": -1 if after_step is None else after_step}
    attempts = int(session.scalar(sqlfiles.load("queries/rollback_count_attempts"), p) or 0)
    used = usefulness.used_by_run_after(session, run_id, p["after_step"])  # before their uses are deleted
    names = (
        *("work", "groups", "fates", "meta_nll_uses", "versions", "experiences"),
        *("evictions", "metrics", "steps", "policy_versions"),
    )
    counts = {name: session.execute(sqlfiles.load(f"queries/rollback_{name}"), p).rowcount for name in names}
    usefulness.refresh_versions(session, used)  # the surviving versions lose the deleted uses
    return RollbackResult(attempts=attempts, **counts)  # order above matters: work reads run_steps; FKs
