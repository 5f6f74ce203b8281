"""A rollout worker: its own engine, the run's queue in the store, and the producer half of every step it claims.

    check the run -> load the run's start and policy -> loop: claim -> serve the newest committed policy (at
    least the claim's) -> generate -> grade -> summarise -> (method = mel) diagnose and replay -> finish (its
    groups, written once)

What a worker needs is the database URL and the run's folder (`output_dir`): the run's config, its problems and
the queue are in the store; the published policy versions are the committed steps, named in `run_steps` with
their hash in `policy_versions`. A checkpointed step's weights are in its checkpoint; a step between checkpoints
(`checkpoint.every > 1`) has its weights staged by the trainer under `staged/<sha256>/`
(`lanpo.train.plumbing.staged`). Either folder is hashed and checked against the version's hash before it loads.
On another machine the run's folder must be mounted at the same path (a shared file system): a LoRA adapter is a
few MB and could live in the store, full weights could not, and one channel serves both.

A worker refuses, with one error line and before it claims anything, a run that does not exist, has finished or
trains synchronously, a model other than the run's, a database it cannot reach, and weights it cannot load or
whose hash is not the published one. A published version removed before the worker read it (a checkpoint or a
staged version pruned by the trainer, or staged weights a resume rolled back) is not an error: the worker loads
the version the store publishes by then.

A resume rolls the store back to its last checkpoint (`lanpo.train.plumbing.checkpoint`), and the rollout work of
the steps it rolls back with it: a claim of such work is lost (its row is gone, so it can neither renew nor finish
it), and the groups a rolled-back version generated are never trained on. A worker that outlives its trainer serves
a version by its step and hash, so it reloads when a redone step commits other weights under the same number.

While it holds a claim a daemon thread renews the lease every third of `lease_s`; a worker that dies stops
renewing, and the claim is redone by the next worker after `lease_s`. SIGTERM (`lanpo.cli` raises it in the main
thread) and Ctrl-C give the claim back at once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy.engine import Engine

from lanpo.config import from_mapping, quiet_renames
from lanpo.db.connection import transaction
from lanpo.db.heartbeat import Beating, owner_tag
from lanpo.db.repo import queue as queue_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import ConfigError, InputError, LanpoError
from lanpo.models import check_model_ref, set_threads
from lanpo.procs import tag_gone
from lanpo.rollout import Completion
from lanpo.train.config import TrainConfig
from lanpo.train.forward.batch import build_batch
from lanpo.train.forward.chunking import Chunking
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import chunked_logprobs
from lanpo.train.mel.experiences import meta_generations
from lanpo.train.parts import Sampler
from lanpo.train.plumbing import checkpoint as ckpt
from lanpo.train.plumbing.dist import Dist
from lanpo.train.plumbing.staged import staged_weights
from lanpo.train.plumbing.timing import Phases
from lanpo.train.policy import Policy, build_policy, load_base
from lanpo.train.producer.produce import Produced, groups_to_json, produce, prompts_from_store
from lanpo.train.producer.rollout_queue import OWNER_ENV
from lanpo.train.producer.served_policy import ServedPolicy, build_summarizer, open_served_policy, start_folder
from lanpo.train.start import START_RECORD, recorded_start

log = logging.getLogger(__name__)

POLL_S = 0.5  # between claims while the queue is empty
PRUNE_RETRIES = 5  # published versions a worker tries in turn when the one it was about to load is removed


@dataclass
class WorkerResult:
    claims: int = 0  # claims finished (their groups written)
    lost: int = 0  # claims whose lease ran out before they finished (their groups not kept)
    versions: list[int] = field(default_factory=list)  # the policy steps it loaded, in order


def run_worker(
    db: Engine,
    run_name: str,
    threads: int = 1,
    lease_s: float | None = None,
    model: str | None = None,
    max_claims: int = 0,
) -> WorkerResult:
    """Serve run `run_name`'s queue until the run ends (or `max_claims` claims are finished)."""
    run_id, cfg = _check_run(db, run_name, model)
    lease = lease_s or cfg.workers.lease_s
    set_threads(threads)
    worker = _Worker(db, run_id, cfg, lease)
    result = WorkerResult()
    owner = os.environ.get(OWNER_ENV)  # set for a local worker: the trainer that started it
    try:
        while max_claims == 0 or result.claims < max_claims:
            if owner and tag_gone(owner):  # a local worker does not outlive the trainer that started it
                log.warning("the trainer that started this worker (%s) is gone: the worker stops", owner)
                break
            claim = worker.claim()
            if claim is None:
                if not _running(db, run_id):
                    log.info("run %s is no longer running: the worker stops", run_name)
                    break
                time.sleep(POLL_S)
                continue
            if worker.serve(claim):
                result.claims += 1
            else:
                result.lost += 1
    finally:  # SIGTERM raises in the main thread (`lanpo.cli`): the claim in hand was given back
        worker.close()
    result.versions = worker.versions
    return result


def _running(db: Engine, run_id: int) -> bool:
    with transaction(db) as session:
        return runs_repo.require_run(session, run_id).status == "running"


def _check_run(db: Engine, run_name: str, model: str | None) -> tuple[int, TrainConfig]:
    """The run's id and config, or the one reason this worker cannot serve it."""
    with transaction(db) as session:
        run = runs_repo.find_run(session, run_name)
        if run is None:
            raise InputError(f"no run named {run_name!r}", hint=runs_repo.LIST_RUNS)
        if run.kind != "train":
            raise InputError(f"run {run_name!r} is a {run.kind} run: workers serve training runs")
        if run.status != "running":
            raise InputError(
                f"run {run_name!r} has {run.status}: there is nothing to generate for it",
                hint="resume it first (lanpo train --resume), then start the worker",
            )
        with quiet_renames():
            cfg = from_mapping(TrainConfig, dict(run.config or {}))
    if not cfg.workers.enabled:
        raise ConfigError(
            f"run {run_name!r} trains synchronously: its trainer takes no rollouts from workers",
            hint="start the run with workers.external = true (or lanpo train --workers N)",
        )
    if model is not None and model != cfg.model.name:
        raise ConfigError(
            f"this worker was asked to serve {model!r}, but run {run_name!r} trains {cfg.model.name!r}",
            hint="leave --model out: a worker loads the run's own model",
        )
    check_model_ref(cfg.model.name, "the run's model.name")
    start = cfg.checkpoint_root() / START_RECORD
    if not start.is_file():
        raise InputError(
            f"the run's folder {cfg.checkpoint_root()} is not readable here (no {start.name})",
            hint="mount the run's output_dir at the same path on this machine (a shared file system)",
        )
    return run.id, cfg


class _Worker:
    """The engine, the policy it serves, and one claim at a time."""

    def __init__(self, db: Engine, run_id: int, cfg: TrainConfig, lease_s: float) -> None:
        self.db, self.run_id, self.cfg, self.lease_s = db, run_id, cfg, lease_s
        self.name = f"worker {owner_tag()}"
        self.versions: list[int] = []
        root = cfg.checkpoint_root()
        with transaction(db) as session:
            published = queue_repo.newest_policy(session, run_id)
        if published is None:
            raise InputError(f"run {run_id} has committed no step yet", hint="start the worker after the trainer")
        base, tokenizer = load_base(cfg.model, cfg.seed)
        base, record = recorded_start(base, root)  # the start the trainer recorded, its adapter merged
        weights = start_folder(cfg, base, tokenizer, root, record, Dist()) if cfg.rollout.backend == "vllm" else None
        self.policy: Policy = build_policy(base, tokenizer, cfg.lora, cfg.seed)
        self.policy.model.eval()
        self.tokenizer = tokenizer
        self.step = -1  # the policy step it serves (none yet)
        self.sha256 = ""  # and that version's hash: a step redone after a resume may hold other weights
        self._load(published)
        self.backend: ServedPolicy = open_served_policy(cfg, self.policy.model, tokenizer, weights, trains=False)
        self.summarizer = build_summarizer(cfg, self.backend, tokenizer, Dist())

    @property
    def sampler(self) -> Sampler:
        return Sampler(self.backend, self.tokenizer, Dist())

    def claim(self) -> queue_repo.Claim | None:
        with transaction(self.db) as session:
            return queue_repo.claim(session, self.run_id, self.name, self.lease_s)

    def serve(self, claim: queue_repo.Claim) -> bool:
        """Produce the claimed step and hand it back; False when the claim was lost before it finished."""
        seconds: dict[str, float] = {}
        keeper = _LeaseKeeper(self.db, claim, self.lease_s)
        try:
            with keeper:
                started = time.perf_counter()
                self._serve_newest(claim.min_policy_step)
                seconds["load_policy"] = time.perf_counter() - started
                got, took = self._produce(claim)
                seconds.update(took)
        except BaseException:
            with transaction(self.db) as session:
                queue_repo.requeue(session, claim)  # nothing half-done stays claimed
            raise
        with transaction(self.db) as session:
            kept = queue_repo.finish(
                session, claim, self.name, self.step, self.backend.served_sha256, groups_to_json(got), seconds
            )
        if not kept:
            log.warning("claim of step %d was lost (its lease ran out): its groups are not kept", claim.step)
        return kept

    def _produce(self, claim: queue_repo.Claim) -> tuple[Produced, dict[str, float]]:
        """The claimed step's groups, and the seconds of its phases."""
        with transaction(self.db) as session:
            prompts = prompts_from_store(session, claim.prompts)
        phase = Phases(self.policy, claim.step)
        got = produce(self.cfg, self.sampler, self.summarizer, claim.step, prompts, phase)
        if self.cfg.method == "mel":  # diagnoses and replays by the policy that generated the groups
            with phase("mel"):
                got.mel = meta_generations(self.cfg, self.sampler, claim.step, prompts, got.groups, got.graded)
        if self.cfg.workers.max_staleness > 0:  # the update weights stale groups by their generating policy
            got.groups = self._with_logprobs(got.groups)
        return got, phase.timer.seconds

    def _serve_newest(self, at_least: int) -> None:
        """Serve the newest committed policy; it is at least `at_least` (the trainer committed it before queuing)."""
        with transaction(self.db) as session:
            published = queue_repo.newest_policy(session, self.run_id)
        if published is None or published.step < at_least:
            raise LanpoError(
                f"the claim needs policy step {at_least}, and the store's newest is "
                f"{None if published is None else published.step}",
                hint="a trainer rolled back past queued work; the claim is given back",
            )
        if (published.step, published.adapter_sha256) != (self.step, self.sha256):
            self._load(published)
            self.backend.sync()

    def _load(self, published: queue_repo.PublishedPolicy) -> None:
        """Load a committed step's weights into the policy, checked against the hash the store publishes.

        A version removed between the store naming it and the worker reading it (a checkpoint or staged version the
        trainer pruned, `checkpoint.keep` and `staged.KEEP`; staged weights a resume cleared) is a race the worker
        lost, not an error: it loads the version the store publishes by then (pruning never removes the newest
        committed step's, so the retry finds one). Only a run folder that is not there at all (another machine, not
        mounted) is a mount problem."""
        for _ in range(PRUNE_RETRIES):
            weights = self._weights(published)
            try:
                self._check_and_load(weights, published)
                break
            except Exception:
                if weights.exists():  # not a folder removed under the load: a real failure
                    raise
            with transaction(self.db) as session:
                newer = queue_repo.newest_policy(session, self.run_id)
            if newer is None or (newer.step, newer.adapter_sha256) == (published.step, published.adapter_sha256):
                raise self._unreadable(published, weights)
            log.info(
                "policy step %d was removed before this worker read it: serving step %d", published.step, newer.step
            )
            published = newer
        else:
            raise LanpoError(
                f"the trainer removed {PRUNE_RETRIES} published versions in turn before this worker could read one",
                hint="keep more checkpoints (checkpoint.keep), so a worker has time to load the newest",
            )
        self.step, self.sha256 = published.step, published.adapter_sha256
        self.versions.append(published.step)
        log.info("serving policy step %d (%s) from %s", published.step, published.adapter_sha256[:12], weights)

    def _check_and_load(self, weights: Path, published: queue_repo.PublishedPolicy) -> None:
        """Load `weights` once their hash is the published version's (the hash `Policy.save` returned on writing)."""
        sha = ckpt.weights_sha256(weights, self.policy.kind)
        if sha != published.adapter_sha256:
            raise InputError(
                f"the weights in {weights} hash to {sha[:12]}, but step {published.step} published "
                f"{published.adapter_sha256[:12]}",
                hint="the run folder changed after the step committed; do not serve it",
            )
        self.policy.load(weights)

    def _weights(self, published: queue_repo.PublishedPolicy) -> Path:
        """The folder of a published version's weights: its checkpoint's, or (a step between checkpoints) the
        trainer's staged copy, named by its hash."""
        if published.checkpoint is None:
            return staged_weights(self.cfg.checkpoint_root(), published.adapter_sha256, self.policy.kind)
        return Path(published.checkpoint) / ckpt.WEIGHTS_DIR[self.policy.kind]

    def _unreadable(self, published: queue_repo.PublishedPolicy, weights: Path) -> InputError:
        """Why a committed step's weights cannot be read: the run's folder is not here, or the step was removed."""
        folder = self.cfg.checkpoint_root()  # the run's output_dir, which holds step-NNNNNN/ and staged/
        if not folder.is_dir():
            return InputError(
                f"the published policy of step {published.step} is not readable here: no run folder {folder}",
                hint="mount the run's output_dir at the same path on this machine (a shared file system)",
            )
        return InputError(
            f"the published policy of step {published.step} is gone from {folder} ({weights} is missing), and the "
            "store publishes no other version",
            hint="something other than the trainer's pruning removed it; resume the run to publish a step again",
        )

    def _with_logprobs(self, groups: list[list[Completion]]) -> list[list[Completion]]:
        """The generating policy's log-prob of every sampled token (softmax(logits / temperature), as the trainer
        computes its own), for engines that report none (hf)."""
        flat = [c for group in groups for c in group]
        if not flat or all(c.logprobs is not None for c in flat):
            return groups
        device = next(self.policy.model.parameters()).device
        batch = build_batch(
            [c.prompt_token_ids for c in flat], [c.token_ids for c in flat], self.tokenizer.pad_token_id, device
        )
        g = self.cfg.grpo  # the step's whole batch: micro-batched and chunked as the trainer's own log-probs
        logprob_settings = LogprobSettings(
            micro_batch_size=g.micro_batch_size,
            temperature=self.cfg.rollout.temperature,
            max_tokens=g.max_tokens_per_micro_batch,
            chunking=Chunking.of(g),
        )  # the defaults' prompt sharing and no autocast, whatever grpo.share_prompts and grpo.autocast say
        logp = chunked_logprobs(self.policy.model, batch, logprob_settings)
        it = iter(replace(c, logprobs=tuple(logp[b, : len(c.token_ids)].tolist())) for b, c in enumerate(flat))
        return [[next(it) for _ in group] for group in groups]

    def close(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()


class _LeaseKeeper(Beating):
    """While the body runs, renew the claim's lease every third of `lease_s` (`Beating`); a lost claim ends it."""

    def __init__(self, db: Engine, claim: queue_repo.Claim, lease_s: float) -> None:
        super().__init__(lease_s / 3, f"lanpo-lease-{claim.id}", f"renewing the lease of claim {claim.id}")
        self.db, self.claim, self.lease_s = db, claim, lease_s

    def beat(self) -> bool:
        with transaction(self.db) as session:
            return queue_repo.renew(session, self.claim, self.lease_s)
