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

import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.engine import transaction
from lanpo.db.models import Run
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import ConfigError, InputError
from lanpo.models import check_device, check_model_ref
from lanpo.paths import output_dir
from lanpo.rollout import make_backend
from lanpo.train import checkpoint as ckpt
from lanpo.train import record
from lanpo.train.config import TrainConfig
from lanpo.train.dist import Dist, init_from_env
from lanpo.train.policy import load_base, load_policy
from lanpo.train.update import cosine_schedule

log = logging.getLogger(__name__)


@dataclass
class Trainer:
    cfg: TrainConfig
    engine: Engine
    run_id: int
    model: Any
    tokenizer: Any
    backend: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    problem_ids: list[int]
    pool: PoolRow  # the experience pool this run reads and writes
    scorer: str | None
    summarizer: tuple[Any, Any] | None  # (backend, tokenizer), or None when summaries are off
    checkpoint_root: Path
    dist: Dist


def updates_per_step(cfg: TrainConfig, world: int = 1) -> int:
    rollouts = cfg.batch_size * cfg.rollout.n // world
    minibatches = max(1, rollouts // cfg.grpo.minibatch_size) if cfg.grpo.minibatch_size else 1
    return cfg.grpo.ppo_epochs * minibatches


def check_before_loading(session: Session, cfg: TrainConfig, resume: bool) -> None:
    """What the store and the disk would refuse, checked before the policy loads (which takes minutes on a CPU)."""
    if not cfg.data.task and cfg.data.dataset not in problems_repo.known_datasets(session):
        record.ensure_dataset(session, cfg.data)  # raises: no problems and nothing to generate them from
    if cfg.feedback.mode in ("inter", "both") and cfg.feedback.scorer:
        contexts_repo.require_scorer(session, cfg.feedback.scorer)
    if not resume and session.scalar(sa.select(Run.id).where(Run.name == cfg.run_name)) is not None:
        record.start_run(session, cfg, cfg.model.name, resume)  # raises: the name is taken, and says what to do
    check_device(None if cfg.model.device == "auto" else cfg.model.device)
    check_model_ref(cfg.model.name, "model.name")
    output_dir(cfg.checkpoint_root(), "checkpoint folder (output_dir)")


def setup(cfg: TrainConfig, engine: Engine, resume: bool) -> tuple[Trainer, int]:
    """Load the policy, build optimizer + schedule, create or resume the run; returns (trainer, first step)."""
    dist = init_from_env()
    if dist.enabled:
        if cfg.batch_size % dist.world:
            raise ConfigError(f"batch_size ({cfg.batch_size}) must be divisible by the number of ranks ({dist.world})")
        if cfg.grpo.skip_zero_spread:
            raise ConfigError("grpo.skip_zero_spread works in a single process only", hint="set it to false")
    if dist.is_main:
        with transaction(engine) as session:
            check_before_loading(session, cfg, resume)
    model, tokenizer = load_policy(cfg.model, cfg.lora, seed=cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.grpo.learning_rate, weight_decay=cfg.grpo.weight_decay)
    scheduler = cosine_schedule(optimizer, cfg.steps * updates_per_step(cfg, dist.world), cfg.grpo.warmup_ratio)
    root = cfg.checkpoint_root()

    shared: dict[str, Any] = {}
    if dist.is_main:
        with transaction(engine) as session:
            problem_ids = record.ensure_dataset(session, cfg.data)
            feedback_inter = cfg.feedback.mode in ("inter", "both")
            scorer = record.resolve_scorer(session, cfg.feedback.scorer) if feedback_inter else None
            start = record.start_run(session, cfg, cfg.model.name, resume)
        if start.last_step is None:
            if cfg.sft.enabled and not cfg.model.init_adapter:
                from lanpo.train.sft import run_sft

                warm = run_sft(cfg, None, engine=engine, progress=False, policy=(model, tokenizer))
                log.info("SFT warm start: %d pairs, loss %.3f -> %.3f", warm.pairs, warm.losses[0], warm.losses[-1])
            path, sha = ckpt.save_checkpoint(root, 0, model, optimizer, scheduler)
            with transaction(engine) as session:
                pv = runs_repo.add_policy_version(session, start.run_id, 0, sha)
                runs_repo.commit_step(session, start.run_id, 0, pv, str(path))
            first, fresh = 1, True
        else:
            path = Path(start.checkpoint) if start.checkpoint else ckpt.step_dir(root, start.last_step)
            loaded = ckpt.load_checkpoint(path, model, optimizer, scheduler)
            if loaded.adapter_sha256 != start.adapter_sha256 or loaded.step != start.last_step:
                raise InputError(
                    f"checkpoint {path} (step {loaded.step}, adapter {loaded.adapter_sha256[:12]}) does not match "
                    f"the database (step {start.last_step}, adapter {str(start.adapter_sha256)[:12]})",
                    hint="the run folder was changed after the run; restore it or start a new run_name",
                )
            log.info("resuming %s after committed step %d", cfg.run_name, start.last_step)
            first, fresh = start.last_step + 1, False
        shared = {
            "run_id": start.run_id,
            "pool": start.pool,
            "first": first,
            "path": str(path),
            "fresh": fresh,
            "ids": problem_ids,
        }
        shared["scorer"] = scorer
    shared = dist.broadcast(shared)
    if not dist.is_main:  # the same weights (and, on resume, optimizer state) as rank 0
        if shared["fresh"]:
            ckpt.load_adapter_weights(model, Path(shared["path"]) / ckpt.ADAPTER_DIR)
        else:
            ckpt.load_checkpoint(Path(shared["path"]), model, optimizer, scheduler)

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
        run_id=shared["run_id"],
        model=model,
        tokenizer=tokenizer,
        backend=backend,
        optimizer=optimizer,
        scheduler=scheduler,
        problem_ids=shared["ids"],
        pool=shared["pool"],
        scorer=shared["scorer"],
        summarizer=summarizer,
        checkpoint_root=root,
        dist=dist,
    )
    return trainer, shared["first"]
