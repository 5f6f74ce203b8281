"""A run's whole life in the store, in one place for every trainer: open or resume, write groups, commit a step,
name its checkpoint, roll back, finish (docs/api.md, "A run's life").

    open_run(session, spec, resume)           # ONE transaction: the checks, the run row, the rollback on resume
    write_groups(session, run, step, ...)     # a step's groups, one at a time or in batches, its lesson cap held;
                                              # with them its MEL rows (`mel`) and replayed rows (`replays`)
    commit_step(session, run, step, ...)      # the caller says the step's groups are complete: the step exists
    name_checkpoint(session, run, step, dir)  # the folder a resume loads for a committed step

Every function takes a session and opens none, so a trainer that writes a step in one transaction (lanpo's own)
keeps it; `Run` is the handle that gives each call a transaction of its own, for callers whose groups finish apart
(verl's agent loop workers, a user's loop). lanpo's trainer (`lanpo.train`), the TRL adapter and the verl adapter
(`lanpo.integrations`) and `StoreClient` all open, write and commit through here.

Concurrency: two processes opening one run name take turns (a transaction-scoped advisory lock on the name), so
exactly one creates it and the other finds it: it resumes it, or is refused. The writers of one step take turns
on (run, step), so the step's lesson cap (`summarizer.max_total_per_step`) counts every lesson written before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.connection import transaction
from lanpo.db.heartbeat import Heartbeat
from lanpo.db.models import Run as RunRow
from lanpo.db.repo import fates as fates_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.db.repo.steps import RollbackResult
from lanpo.errors import ConfigError, InputError
from lanpo.feedback import record as rows
from lanpo.feedback import record_mel
from lanpo.feedback.replay_draw import ReplayDraw
from lanpo.feedback.store import RunRef
from lanpo.mel.config import MELConfig

log = logging.getLogger(__name__)

SHOWN = {"trl": "TRL", "verl": "verl", "api": "store API"}  # runs.config->>'trainer' as an error names it


@dataclass(frozen=True)
class RunSpec:
    """What a run is opened as: its name, the model it trains, its pool, and what a new run's row keeps."""

    name: str
    model: str
    pool: str  # the experience pool it reads and writes
    store: StoreConfig  # the pool's capacity settings (a pool that exists must have the same)
    config: dict[str, Any] = field(default_factory=dict)  # runs.config of a new run
    trainer: str | None = None  # runs.config->>'trainer' (trl, verl, api); None: lanpo's own trainer
    experiment_id: int | None = None
    arm: str | None = None
    pool_of_model: bool = False  # refuse a pool holding lessons of another model's runs
    resume_hint: str = "resume it, or choose another run name"  # what a refused name says to do


@dataclass(frozen=True)
class Opened:
    """A run opened in the store: created now, or resumed after `last_step` (None: from scratch), its later rows
    rolled back (`rolled_back`) and what the resume loads (the step's checkpoint folder and weights)."""

    run_id: int
    pool: PoolRow
    created: bool
    last_step: int | None = None
    checkpoint: str | None = None
    adapter_sha256: str | None = None
    rolled_back: RollbackResult | None = None

    @property
    def next_step(self) -> int:
        """The step to run next."""
        return 1 if self.last_step is None else self.last_step + 1


def _kind(config: dict[str, Any] | None, kind: str) -> str:
    trainer = (config or {}).get("trainer")
    return SHOWN.get(trainer, trainer) if trainer else f"lanpo {kind}"


def check_run(session: Session, spec: RunSpec, resume: bool, after: int | None = None) -> RunRow | None:
    """The run named `spec.name` (None: there is none yet), checked against an open of `spec`; writes nothing.
    Refused: a pool of another model's lessons (`spec.pool_of_model`), a name taken by another kind of run or
    another model's, an existing run without `resume`, a run another process still holds, and a resume from step
    `after` > 0 of a run the store does not hold."""
    if spec.pool_of_model:
        other = pools_repo.other_model(session, spec.pool, spec.model)
        if other is not None:
            raise InputError(
                f"pool {spec.pool!r} holds lessons of {other}, not of {spec.model}",
                hint="set store.pool to a pool of this model's runs, or a new one",
            )
    run = runs_repo.find_run(session, spec.name)
    if run is None:
        if after:
            raise InputError(
                f"resuming from step {after}, and the store holds no run named {spec.name!r}",
                hint="resume against the database the run wrote to (LANPO_DATABASE_URL), or start afresh",
            )
        return None
    ours, theirs = _kind({"trainer": spec.trainer}, "train"), _kind(run.config, run.kind)
    if theirs != ours:
        raise InputError(f"run {spec.name!r} is a {theirs} run, not a {ours} one", hint="choose another run name")
    if run.model is not None and run.model != spec.model:  # (a run that names no model is no other model's)
        raise InputError(f"run {spec.name!r} trained {run.model}, not {spec.model}", hint="choose another run name")
    if not resume:
        raise ConfigError(f"a run named {spec.name!r} already exists", hint=spec.resume_hint)
    if run.status == "running":  # its process died (SIGKILL, a lost machine) -- or is still training it
        runs_repo.require_lost(session, run, "resumed")
    return run


def open_run(
    session: Session, spec: RunSpec, resume: bool = False, after: int | None = None, roll_back: bool = True
) -> Opened:
    """Create the run `spec` names with its pool, or (`resume`) resume it, in the caller's ONE transaction, the
    name's lock held to its end (`check_run` says what is refused). A resume continues after step `after` (None:
    the run's last checkpointed step) and rolls back everything newer (its uncommitted groups, and committed steps
    after that checkpoint, evictions undone: `steps.rollback_uncommitted`); `roll_back=False` leaves that to the
    caller's first step (`roll_back_after`: verl learns the step it resumes from only then)."""
    runs_repo.lock_name(session, spec.name)  # a second opener waits here, then finds the first's run
    run = check_run(session, spec, resume, after)
    pool = pools_repo.ensure_pool(session, spec.pool, spec.store)
    if run is None:
        run = runs_repo.create_run(
            session, spec.name, "train", spec.config, spec.model, pool.id, spec.experiment_id, spec.arm
        )
        return Opened(run.id, pool, created=True)
    if run.pool_id != pool.id:
        raise ConfigError(
            f"run {spec.name!r} writes pool #{run.pool_id}, but this config names pool {pool.name!r}",
            hint="resume with the [store] settings the run started with",
        )
    last = steps_repo.last_checkpointed_step(session, run.id) if after is None else after
    rolled = roll_back_after(session, run.id, last) if roll_back else None
    runs_repo.reopen_run(session, run.id)
    state = None if last is None else steps_repo.find_committed_step(session, run.id, last)
    checkpoint, sha = (None, None) if state is None else (state.checkpoint, state.adapter_sha256)
    return Opened(run.id, pool, False, last, checkpoint, sha, rolled)


def attach_run(session: Session, run_id: int, pool_name: str) -> Opened:
    """Run `run_id` as another process opened it (a worker's view of the run its driver opened)."""
    run = runs_repo.require_run(session, run_id)
    return Opened(run.id, pools_repo.get_pool(session, pool_name), created=False)


def roll_back_after(session: Session, run_id: int, step: int | None) -> RollbackResult:
    """Delete the run's rows of steps after `step` (None: every step), committed or not, evictions undone, and
    say so in the log when anything went."""
    committed = steps_repo.last_committed_step(session, run_id)
    written = steps_repo.last_group_step(session, run_id)
    rolled = steps_repo.rollback_uncommitted(session, run_id, step)
    newest = max((s for s in (committed, written) if s is not None), default=None)
    if newest is not None and (step is None or newest > step):
        log.warning("%s", rolled.line(-1 if step is None else step, newest))
    return rolled


def write_groups(
    session: Session,
    run: RunRef,
    step: int,
    policy_version_id: int | None,
    records: list[rows.GroupRecord],
    author: str,
    max_total_per_step: int = 0,
    mel: MELConfig | None = None,
    replays: Sequence[ReplayDraw] = (),
) -> rows.StepWrite:
    """Groups of step `step` (all of them, a batch, or one), their lessons admitted under the pool's capacity
    policies and within the step's lesson cap (`max_total_per_step`, 0: none) across every writer of the step:
    the writers of (run, step) take turns, and lessons past the cap are dropped (the rollouts stay). Then, in the
    same transaction: with `mel` (the run's `[mel]`; None: not a MEL run) the MEL pairs the records carry
    (`GroupRecord.meta`), their lessons and replays (`record_mel.record_meta`, whose metrics join the result's
    `as_metrics`); and the stored trajectories the step replayed (`replays`, `[replay]`'s draws)."""
    steps_repo.lock_step(session, run.run_id, step)
    fates_repo.replace_keyed(session, run.run_id, [r.trainer_uid for r in records if r.trainer_uid is not None])
    hold_step_cap(session, run.run_id, step, records, max_total_per_step)
    written = rows.write_step_rows(session, run.run_id, run.pool, step, policy_version_id, records, author)
    name_written(session, records, written.attempt_ids)
    written.mel_metrics = record_mel.record_meta(
        session, mel, run.run_id, run.pool, step, policy_version_id, records, written.attempt_ids
    )
    rows.write_replays(session, run.run_id, step, policy_version_id, replays)
    return written


def name_written(session: Session, records: list[rows.GroupRecord], attempt_ids: list[list[int]]) -> None:
    """The trainer's names of written groups (`GroupRecord.trainer_uid`), and the segments' policy versions of
    responses generated under several (`RolloutRecord.first_policy_version_id`, `.last_policy_version_id`)."""
    named = [(ids[0], r.trainer_uid) for r, ids in zip(records, attempt_ids, strict=True) if r.trainer_uid and ids]
    fates_repo.name_groups(session, [a for a, _ in named], [u for _, u in named])
    segments = [
        (a, o.first_policy_version_id, o.last_policy_version_id)
        for r, ids in zip(records, attempt_ids, strict=True)
        for o, a in zip(r.rollouts, ids, strict=True)
    ]
    fates_repo.set_segments(session, segments)


def redispatch(session: Session, run: RunRef, uids: Sequence[str]) -> int:
    """The trainer dispatches groups named `uids` (anew, or again after a resume: verl re-issues the prompts a
    killed run left in flight under their uids): the rows a killed run wrote of them, and their lessons, go before
    any draw can read them. Returns the groups removed."""
    return fates_repo.replace_keyed(session, run.run_id, list(uids))


def consume_groups(
    session: Session, run: RunRef, step: int, trained: Sequence[str], dropped: dict[str, str]
) -> fates_repo.Consumed:
    """The trainer took these groups (named by `trainer_uid`) off its buffer at `step`: `trained`, or `dropped`
    (uid -> stale | filtered | failed). For trainers that train a group at a later step than the one that wrote it
    (verl's asynchronous modes); each group's first fate stands."""
    return fates_repo.consume(session, run.run_id, step, trained, dropped)


def hold_step_cap(
    session: Session, run_id: int, step: int, records: list[rows.GroupRecord], max_total_per_step: int
) -> None:
    """Drop the records' lessons past the step's cap (0: none), counting those the step has added so far. Callers
    that choose lessons before writing (`lessons_left`) still pass here: a sibling writer may admit some meanwhile.
    Holds across writers only under the step's lock (`write_groups` takes it first)."""
    if not max_total_per_step:
        return
    made = steps_repo.step_lessons(session, run_id, step)
    for rollout in (r for record in records for r in record.rollouts):
        if rollout.summary is not None:
            if made >= max_total_per_step:
                rollout.summary = None
            else:
                made += 1


def lessons_left(session: Session, run: RunRef, step: int, max_total_per_step: int) -> int:
    """How many more lessons step `step` may add (-1: no cap)."""
    if not max_total_per_step:
        return -1
    return max(0, max_total_per_step - steps_repo.step_lessons(session, run.run_id, step))


def commit_step(
    session: Session,
    run: RunRef,
    step: int,
    policy_version_id: int | None = None,
    checkpoint: str | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    """Step `step` is complete: its metrics are recorded and the step committed, last in the caller's transaction
    (a step commits once). `policy_version_id`: the weights the step's row names; `checkpoint`: the folder a resume
    loads for it (or name it later: `name_checkpoint`)."""
    if metrics:
        runs_repo.record_metrics(session, run.run_id, step, metrics)
    steps_repo.commit_step(session, run.run_id, step, policy_version_id, checkpoint)


def commit_written(session: Session, run: RunRef, before: int | None = None, trained: int | None = None) -> list[int]:
    """Commit every step before `before` (None: every step) whose groups were written one by one and which is not
    committed, each with its rollout metrics read back from its rows and the pool's size, naming the policy version
    that generated it (step - 1). `trained`: a step that trained groups earlier steps wrote (verl's asynchronous
    modes; `consume_groups` named them) commits too, written rows of its own or not, its metrics over the groups it
    trained. Returns the steps committed."""
    done = steps_repo.uncommitted_steps(session, run.run_id, 2**31 - 1 if before is None else before)
    if trained is not None and trained not in done and not steps_repo.is_committed(session, run.run_id, trained):
        done = sorted([*done, trained])
    for step in done:
        version = steps_repo.policy_version_id(session, run.run_id, step - 1)
        metrics = written_metrics(session, run, step, trained=step == trained)
        commit_step(session, run, step, version, metrics=metrics)
    return done


def written_metrics(session: Session, run: RunRef, step: int, trained: bool = False) -> dict[str, float]:
    """The metrics of a step whose groups were written apart, read back from its rows (`trained`: the groups it
    trained), and the pool's size."""
    metrics = steps_repo.step_rollout_metrics(session, run.run_id, step, trained)
    metrics["pool/active"] = float(pools_repo.active_size(session, run.pool.id))
    return metrics


def name_checkpoint(session: Session, run: RunRef, step: int, folder: str) -> bool:
    """Name the checkpoint folder of committed step `step` (a trainer whose checkpoint follows the commit); False
    when the step made no rows."""
    return steps_repo.set_checkpoint(session, run.run_id, step, folder)


def finish_run(session: Session, run: RunRef, failed: bool = False) -> None:
    runs_repo.finish_run(session, run.run_id, "failed" if failed else "finished")


class Run:
    """A run opened in the store, each call its own transaction: for a loop whose groups finish apart, and whose
    steps commit when the caller says. `opened` says where it continues (`next_step`) and what to load."""

    def __init__(self, db: Engine, opened: Opened, author: str = "policy", max_total_per_step: int = 0) -> None:
        self.db, self.opened = db, opened
        self.ref = RunRef(db, opened.run_id, opened.pool)
        self.author, self.max_total_per_step = author, max_total_per_step
        self._heartbeat: Heartbeat | None = None

    @property
    def run_id(self) -> int:
        return self.ref.run_id

    @property
    def pool(self) -> PoolRow:
        return self.ref.pool

    @property
    def next_step(self) -> int:
        return self.opened.next_step

    def write_groups(
        self,
        step: int,
        records: list[rows.GroupRecord],
        policy_version_id: int | None = None,
        mel: MELConfig | None = None,
        replays: Sequence[ReplayDraw] = (),
    ) -> rows.StepWrite:
        """`write_groups` in a transaction of its own."""
        with transaction(self.db) as session:
            return write_groups(
                session, self.ref, step, policy_version_id, records, self.author, self.max_total_per_step, mel, replays
            )

    def redispatch(self, uids: Sequence[str]) -> int:
        """`redispatch` in a transaction of its own."""
        with transaction(self.db) as session:
            return redispatch(session, self.ref, uids)

    def consume(self, step: int, trained: Sequence[str], dropped: dict[str, str]) -> fates_repo.Consumed:
        """`consume_groups` in a transaction of its own."""
        with transaction(self.db) as session:
            return consume_groups(session, self.ref, step, trained, dropped)

    def lessons_left(self, step: int) -> int:
        with transaction(self.db) as session:
            return lessons_left(session, self.ref, step, self.max_total_per_step)

    def commit_step(
        self,
        step: int,
        checkpoint: str | None = None,
        metrics: dict[str, float] | None = None,
        policy_version_id: int | None = None,
    ) -> None:
        with transaction(self.db) as session:
            commit_step(session, self.ref, step, policy_version_id, checkpoint, metrics)

    def commit_written(self, before: int | None = None, trained: int | None = None) -> list[int]:
        with transaction(self.db) as session:
            return commit_written(session, self.ref, before, trained)

    def name_checkpoint(self, step: int, folder: str) -> bool:
        with transaction(self.db) as session:
            return name_checkpoint(session, self.ref, step, folder)

    def roll_back_after(self, step: int | None) -> RollbackResult:
        with transaction(self.db) as session:
            return roll_back_after(session, self.run_id, step)

    def record_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with transaction(self.db) as session:
            runs_repo.record_metrics(session, self.run_id, step, metrics)

    def add_policy_version(self, step: int, sha256: str) -> int:
        """Record the weights after step `step` (64 hex digits); its id."""
        with transaction(self.db) as session:
            return steps_repo.add_policy_version(session, self.run_id, step, sha256)

    @contextmanager
    def held(self) -> Iterator[Run]:
        """`with run.held():` this process holds the run and beats (`lanpo runs` shows it alive)."""
        with Heartbeat(self.db, self.run_id):
            yield self

    def hold(self) -> None:
        """Hold the run with a heartbeat until `finish` (a caller whose start and end are separate hooks)."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self.db, self.run_id)
            self._heartbeat.__enter__()

    def finish(self, failed: bool = False) -> None:
        """Mark the run finished (or failed), its heartbeat stopped."""
        if self._heartbeat is not None:
            self._heartbeat.__exit__(None, None, None)
            self._heartbeat = None
        with transaction(self.db) as session:
            finish_run(session, self.ref, failed)
