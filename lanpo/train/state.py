"""Everything a training step needs, built once: policy, optimizer + schedule, backends, the run in the store.

`setup` creates the run (or resumes it: the database's last committed step decides which checkpoint loads;
newer checkpoints on disk are ignored) and commits step 0, the initial adapter, so resume always has an anchor.
Under torchrun only rank 0 touches the database and the checkpoint folder; the other ranks receive what they
need by broadcast and load the same adapter weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.engine import transaction
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import InputError
from lanpo.models import check_device, check_model_ref
from lanpo.paths import output_dir
from lanpo.rollout import make_backend
from lanpo.train import checkpoint as ckpt
from lanpo.train.config import TrainConfig
from lanpo.train.dist import Dist, init_from_env
from lanpo.train.policy import load_base, load_policy
from lanpo.train.run import RunStart, ensure_dataset, open_run, resolve_scorer
from lanpo.train.update import cosine_schedule, minibatches_per_epoch

log = logging.getLogger(__name__)


@dataclass
class Trainer:
    cfg: TrainConfig
    engine: Engine
    run_id: int
    model: Any  # the PEFT policy (its adapter off: the reference)
    ddp: Any  # what the update's gradient flows through: DDP over `model` under torchrun, else None
    tokenizer: Any
    backend: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    problem_ids: list[int]
    pool: PoolRow  # the experience pool this run reads and writes
    scorer: str | None
    summarizer: tuple[Any, Any] | None  # (backend, tokenizer), or None when summaries are off
    summary_author: str  # experience_versions.author of the lessons it writes
    checkpoint_root: Path
    dist: Dist


def updates_per_step(cfg: TrainConfig) -> int:
    """Optimizer steps per training step: the same at every world size (minibatches count global sequences)."""
    return cfg.grpo.ppo_epochs * minibatches_per_epoch(cfg.batch_size * cfg.rollout.n, cfg.grpo)


def check_before_loading(session: Session, cfg: TrainConfig, resume: bool) -> None:
    """What the store and the disk would refuse, checked before the policy loads (which takes minutes on a CPU)."""
    if not cfg.data.task and cfg.data.dataset not in problems_repo.known_datasets(session):
        ensure_dataset(session, cfg.data)  # raises: no problems and nothing to generate them from
    if cfg.feedback.mode in ("inter", "both") and cfg.feedback.scorer:
        contexts_repo.require_scorer(session, cfg.feedback.scorer)
    if not resume and runs_repo.find_run(session, cfg.run_name) is not None:
        open_run(session, cfg, cfg.model.name, resume)  # raises: the name is taken, and says what to do
    check_device(None if cfg.model.device == "auto" else cfg.model.device)
    check_model_ref(cfg.model.name, "model.name")
    output_dir(cfg.checkpoint_root(), "checkpoint folder (output_dir)")


def setup(cfg: TrainConfig, engine: Engine, resume: bool) -> tuple[Trainer, int]:
    """Load the policy, build optimizer + schedule, create or resume the run; returns (trainer, first step)."""
    dist = init_from_env()
    cfg.check_world(dist.world)
    if dist.is_main:
        with transaction(engine) as session:
            check_before_loading(session, cfg, resume)
    model, tokenizer = load_policy(cfg.model, cfg.lora, seed=cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.grpo.learning_rate, weight_decay=cfg.grpo.weight_decay)
    scheduler = cosine_schedule(optimizer, cfg.steps * updates_per_step(cfg), cfg.grpo.warmup_ratio)
    root = cfg.checkpoint_root()

    shared: dict[str, Any] = {}
    if dist.is_main:
        with transaction(engine) as session:
            problem_ids = ensure_dataset(session, cfg.data)
            feedback_inter = cfg.feedback.mode in ("inter", "both")
            scorer = resolve_scorer(session, cfg.feedback.scorer) if feedback_inter else None
            start = open_run(session, cfg, cfg.model.name, resume)
        shared = {"start": start, "ids": problem_ids, "scorer": scorer}
    shared = dist.broadcast(shared)
    start = shared["start"]
    if start.last_step is not None:  # every rank: the committed checkpoint's adapter, optimizer and schedule
        _resume_from(cfg, start, model, optimizer, scheduler, root)
    ddp = dist.wrap(model) if dist.enabled else None  # DDP also broadcasts rank 0's weights once, here
    first = 1 if start.last_step is None else start.last_step + 1
    if start.last_step is None:
        _step_zero(cfg, engine, start, model, tokenizer, optimizer, scheduler, root, dist, ddp)

    backend = make_backend(cfg.rollout.backend, model, tokenizer)
    summarizer = None
    if cfg.summarizer.enabled and cfg.feedback.mode in ("inter", "both"):
        if cfg.summarizer.model == "policy":
            summarizer = (backend, tokenizer)
        else:
            s_model, s_tok = load_base(replace(cfg.model, name=cfg.summarizer.model, init_adapter=None), cfg.seed)
            summarizer = (make_backend(cfg.rollout.backend, s_model, s_tok), s_tok)
    trainer = Trainer(
        cfg=cfg,
        engine=engine,
        run_id=start.run_id,
        model=model,
        ddp=ddp,
        tokenizer=tokenizer,
        backend=backend,
        optimizer=optimizer,
        scheduler=scheduler,
        problem_ids=shared["ids"],
        pool=start.pool,
        scorer=shared["scorer"],
        summarizer=summarizer,
        summary_author=cfg.summarizer.model,  # "policy", or the summariser model's name
        checkpoint_root=root,
        dist=dist,
    )
    return trainer, first


def _step_zero(
    cfg: TrainConfig,
    engine: Engine,
    start: RunStart,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    root: Path,
    dist: Dist,
    ddp: Any,
) -> None:
    """A new run: the SFT warm start (every rank, data-parallel), then rank 0 commits the initial adapter as step 0."""
    if cfg.sft.enabled and not cfg.model.init_adapter:
        from lanpo.train.sft import run_sft

        warm = run_sft(cfg, None, engine=engine, progress=False, policy=(model, tokenizer), dist=dist, ddp=ddp)
        log.info("SFT warm start: %d pairs, loss %.3f -> %.3f", warm.pairs, warm.losses[0], warm.losses[-1])
    if dist.is_main:
        path, sha = ckpt.save_checkpoint(root, 0, model, optimizer, scheduler)
        with transaction(engine) as session:
            pv = steps_repo.add_policy_version(session, start.run_id, 0, sha)
            steps_repo.commit_step(session, start.run_id, 0, pv, str(path))
    dist.barrier()


def _resume_from(
    cfg: TrainConfig, start: RunStart, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, root: Path
) -> None:
    """Load the checkpoint the database names for the last committed step, and check it is that one."""
    assert start.last_step is not None
    path = Path(start.checkpoint) if start.checkpoint else ckpt.step_dir(root, start.last_step)
    loaded = ckpt.load_checkpoint(path, model, optimizer, scheduler)
    if loaded.adapter_sha256 != start.adapter_sha256 or loaded.step != start.last_step:
        raise InputError(
            f"checkpoint {path} (step {loaded.step}, adapter {loaded.adapter_sha256[:12]}) does not match "
            f"the database (step {start.last_step}, adapter {str(start.adapter_sha256)[:12]})",
            hint="the run folder was changed after the run; restore it or start a new run_name",
        )
    log.info("resuming %s after committed step %d", cfg.run_name, start.last_step)
