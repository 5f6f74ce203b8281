"""lanpo's training run in the store, created with its pool, or resumed after its last committed step with anything
newer rolled back. (What any trainer reads first, its dataset and relevance scorer, is `lanpo.feedback.store`.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.orm import Session

from lanpo.config import to_mapping
from lanpo.db.repo import experiments as experiments_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import ConfigError
from lanpo.train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class RunStart:
    run_id: int
    pool: PoolRow  # the experience pool the run reads and writes
    last_step: int | None  # last checkpointed step, the store rolled back to it (None: start from scratch)
    checkpoint: str | None
    adapter_sha256: str | None


def open_run(session: Session, cfg: TrainConfig, model_name: str, resume: bool) -> RunStart:
    """Create the run and its pool, or (resume) find it, roll it back to its last checkpointed step (its uncommitted
    rows, and the committed steps after that checkpoint: `steps_repo.rollback_uncommitted`) and say where to
    continue."""
    run = runs_repo.find_run(session, cfg.run_name)
    if run is None:
        pool = pools_repo.ensure_pool(session, cfg.pool_name(), cfg.store)
        experiment = None if cfg.experiment is None else experiments_repo.get_experiment(session, cfg.experiment).id
        run = runs_repo.create_run(
            session, cfg.run_name, "train", to_mapping(cfg), model_name, pool.id, experiment, cfg.arm
        )
        return RunStart(run.id, pool, None, None, None)
    if (run.config or {}).get("trainer") == "trl":  # lanpo.integrations.trl: its steps are TRL's, its weights too
        raise ConfigError(
            f"run {cfg.run_name!r} was trained by TRL's GRPOTrainer through lanpo's store, not by lanpo train",
            hint="resume it from its TRL checkpoint (trainer.train(resume_from_checkpoint=...)), or set run_name",
        )
    if not resume:
        raise ConfigError(
            f"a run named {cfg.run_name!r} already exists",
            hint="pass --resume to continue it, or set run_name (e.g. `--set run_name=NEW`) for a new run",
        )
    if run.status == "running":  # its process died (SIGKILL, a lost machine) -- or is still training it
        runs_repo.require_lost(session, run, "resumed")
    pool = pools_repo.ensure_pool(session, cfg.pool_name(), cfg.store)
    if run.pool_id != pool.id:
        raise ConfigError(
            f"run {cfg.run_name!r} writes pool #{run.pool_id}, but this config names pool {pool.name!r}",
            hint="resume with the [store] settings the run started with",
        )
    # the last checkpointed step decides (every committed step, with checkpoint.every = 1): the committed steps
    # after it are rolled back with the uncommitted rows, in this one transaction, evictions included
    committed = steps_repo.last_committed_step(session, run.id)
    last = steps_repo.last_checkpointed_step(session, run.id)
    rolled = steps_repo.rollback_uncommitted(session, run.id, last)
    if committed is not None and last is not None and committed > last:
        log.warning("%s", rolled.line(last, committed))
    elif rolled.groups or rolled.steps or rolled.experiences:
        log.warning("resume: rolled back uncommitted rows after step %s: %s", last, rolled)
    runs_repo.reopen_run(session, run.id)
    if last is None:
        return RunStart(run.id, pool, None, None, None)
    state = steps_repo.committed_step(session, run.id, last)
    return RunStart(run.id, pool, last, state.checkpoint, state.adapter_sha256)
