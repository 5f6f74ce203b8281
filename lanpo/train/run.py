"""lanpo's training run in the store, as the store API opens it (`lanpo.feedback.lifecycle.open_run`): created
with its pool, or resumed after its last checkpointed step with anything newer rolled back. (What any trainer reads
first, its dataset and relevance scorer, is `lanpo.feedback.store`.)
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from lanpo.config import to_mapping
from lanpo.db.repo import experiments as experiments_repo
from lanpo.feedback.lifecycle import Opened, RunSpec
from lanpo.feedback.lifecycle import open_run as open_in_store
from lanpo.train.config import TrainConfig

RESUME_HINT = "pass --resume to continue it, or set run_name (e.g. `--set run_name=NEW`) for a new run"


def run_spec(session: Session, cfg: TrainConfig, model_name: str) -> RunSpec:
    """The run `cfg` trains: its name, model, pool, config and experiment arm."""
    experiment = None if cfg.experiment is None else experiments_repo.get_experiment(session, cfg.experiment).id
    return RunSpec(
        cfg.run_name,
        model_name,
        cfg.pool_name(),
        cfg.store,
        to_mapping(cfg),
        experiment_id=experiment,
        arm=cfg.arm,
        resume_hint=RESUME_HINT,
    )


def open_run(session: Session, cfg: TrainConfig, model_name: str, resume: bool) -> Opened:
    """Create the run and its pool, or (resume) resume it after its last checkpointed step, in the caller's one
    transaction (`lanpo.feedback.lifecycle.open_run` says what is refused and what is rolled back)."""
    return open_in_store(session, run_spec(session, cfg, model_name), resume)
