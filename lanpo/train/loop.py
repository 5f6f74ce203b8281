"""The LANPO GRPO loop: one readable step, from sampling feedback contexts to the committed database rows.

    batch of problems -> feedback contexts from the store -> n rollouts per prompt -> rewards -> summaries
    -> group advantages -> reference log-probs -> clipped policy update -> checkpoint -> ONE transaction

Where this departs from textbook GRPO (and why):
- Language feedback: with probability p_t a problem's prompt carries an intra-sample context (the model's own
  earlier responses to the same problem, never their reward) or an inter-sample one (lessons summarised from
  other problems with relevance >= gamma). Rollouts of all modes share one group per prompt; a prompt that asked
  for feedback and got none (empty store, nothing relevant, too long to fit) is an honest zero-shot rollout, and
  the step's metrics say how many asked, how many were served and why the others were not.
- Clip-higher (eps_low / eps_high), token-mean aggregation and a k3 KL penalty against the reference policy, the
  start: with LoRA the same model with the adapter disabled (no second copy in memory); under full fine-tuning
  (`lora.enabled = false`, the paper's recipe) a frozen copy of the start's weights (`lanpo.train.policy`).
- With one PPO epoch and one minibatch the rollouts are on-policy: old_logp is the detached log-prob of the
  same forward that carries the gradient (ratio == 1), so no separate no-grad pass is spent on it. When the
  rollouts come from another engine (vLLM), `grpo.tis_cap` weights each token by the truncated ratio of the
  trainer's to the engine's log-prob (truncated importance sampling).
- A group with zero reward spread gets advantage 0 (it contributes only the KL term); with
  `grpo.skip_zero_spread` (DAPO-style) such groups are left out of the update altogether.
- Log-probs are taken for completion tokens only (`logits_to_keep`): the vocabulary projection never runs over
  prompt tokens.
- Successful rollouts are distilled into experiences by the summariser (default: the policy before this step's
  update); they join the run's pool in the same transaction as the attempts that produced them, and only with the
  lesson's format (`summarizer.require_format`; the step's summary/* metrics count the rest).
- With `[replay]` (off by default), stored trajectories of a step's problems join their groups after the fresh
  rollouts (`lanpo.train.replay`): the group's advantages take them in (RLEP, ExGRPO) or normalise them apart (RePO),
  and their tokens' term is the correction's (`lanpo.rl.replay_loss`); they are written as `replayed` groups.
- With `method = "mel"` (meta-experience learning, `lanpo.train.mel.experiences`), groups with both correct and
  incorrect rollouts give contrastive pairs whose diagnosed lessons are validated by replay; the validated ones add an
  NLL term to the update, J = J_GRPO + lambda * J_NLL, and join the pool as experiences of kind `meta`.

Asynchronous GRPO (`[workers]`): the producer half (contexts -> rollouts -> rewards -> summaries,
`lanpo.train.producer.produce`) runs in `lanpo worker` processes that take the step's prompts from the store and hand
its groups back; the step takes them (`lanpo.train.producer.rollout_queue`), at most `workers.max_staleness` updates
stale, and runs the consumer half unchanged. Stale groups carry their generating policy's log-probs for `grpo.tis_cap`.

Crash safety: the checkpoint of step s is written (tmp dir + rename) before step s's transaction commits, and
`commit_step` is the transaction's last statement. Checkpoints are written every `checkpoint.every` steps and at
the last; resume loads the last checkpointed step's and rolls the store's later steps back to it, their
evictions too (`lanpo.feedback.lifecycle.open_run`), so the step after it draws from the pool as it stood then. With
workers, a step between checkpoints stages its weights alone for them (`lanpo.train.plumbing.staged`).
With `rollout.vllm.sleep_during_update` (CUDA) the vLLM engine sleeps from after the step's last generation (MEL's
replays included) to the weight sync, so the reference pass and the update have its GPU memory
(`ServedPolicy.sleep`, `ServedPolicy.sync`).
Under torchrun each rank runs this same step on its share of the prompts (`lanpo.train.plumbing.dist`); a sharded
(FSDP) policy holds its full weights on every rank while the ranks generate with the hf backend (`policy.generating()`;
with vLLM the engine generates from weights of its own and the shards stay shards).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine

from lanpo.config import to_mapping
from lanpo.db.connection import connect, transaction
from lanpo.db.repo import queue as queue_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.feedback import lifecycle, record
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.record import GroupRecord, RolloutTokens
from lanpo.report.live import MetricsLogger
from lanpo.rollout import Completion
from lanpo.seeds import mix_seed
from lanpo.train.config import TrainConfig
from lanpo.train.consumer.replay_rows import ReplayRows
from lanpo.train.consumer.update import NLLTerm, UpdateStats, update_policy
from lanpo.train.forward.batch import RolloutBatch, autocast_dtype, build_batch
from lanpo.train.mel.experiences import MetaStep, meta_experiences
from lanpo.train.parts import StepStore
from lanpo.train.plumbing import checkpoint as ckpt
from lanpo.train.plumbing import staged
from lanpo.train.plumbing.dist import Dist, gather_step
from lanpo.train.plumbing.step_line import validation_line
from lanpo.train.plumbing.timing import Phases
from lanpo.train.policy import Policy
from lanpo.train.producer.contexts import feedback_prompts
from lanpo.train.producer.produce import Produced, produce
from lanpo.train.producer.rollout_queue import LocalWorkers
from lanpo.train.producer.served_policy import behavior_logprobs
from lanpo.train.replay import (
    StepReplay,
    attach_tokens,
    behaviour_rows,
    draw_step_replays,
    replay_batch,
    step_advantages,
)
from lanpo.train.state import Trainer, setup
from lanpo.train.validate import due, validate, validated

log = logging.getLogger(__name__)

__all__ = ["TrainResult", "grpo_step", "train"]


@dataclass
class TrainResult:
    run_id: int
    run_name: str
    steps: list[int]  # steps completed by this call
    checkpoint_dir: Path
    metrics: list[dict[str, float]] = field(default_factory=list)
    validation: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> val/... metrics (rank 0)


def train(
    config: TrainConfig,
    db: Engine | None = None,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> TrainResult:
    """Run (or resume) GRPO training; returns the run and the metrics of the steps done by this call.

    `on_step(step, metrics)` follows each committed step, `notify(line)` what runs before step 1 (the SFT warm
    start, the first validation), both on rank 0 only: for callers that print progress without the bar."""
    db = db or connect()
    trainer, start = setup(config, db, resume, notify)
    main = trainer.dist.is_main
    result = TrainResult(trainer.run_id, config.run_name, [], trainer.checkpoint_root)
    live = MetricsLogger(
        config.report_to if main else [], config.run_name, trainer.checkpoint_root, to_mapping(config)
    )
    bar = _progress(progress and main, start, config.steps)
    workers = _start_workers(trainer, db) if main else None
    try:
        with runs_repo.run_lifecycle(db, trainer.run_id if main else None), live:
            # the start (or, resumed, the last committed step) is validated first, when due and not done yet
            for step, val in _validate_if_due(trainer, start - 1).items():
                result.validation[step] = val
                live.log(step, val)
                if notify is not None and main:
                    notify(validation_line(step, val))
            for step in range(start, config.steps + 1):
                metrics = grpo_step(trainer, step)
                for val in _validate_if_due(trainer, step).values():
                    result.validation[step] = val
                    metrics.update(val)
                result.steps.append(step)
                result.metrics.append(metrics)
                live.log(step, metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy/mean']:.2f}")
                if on_step is not None and main:
                    on_step(step, metrics)
    finally:
        if bar is not None:
            bar.close()
        if workers is not None:
            workers.close()
        trainer.backend.close()  # a vLLM engine runs in processes of its own
    return result


def _start_workers(t: Trainer, db: Engine) -> LocalWorkers | None:
    """`workers.count` local `lanpo worker` processes on this run's queue, against this trainer's database."""
    if t.queue is None or t.cfg.workers.count == 0:
        return None
    w = t.cfg.workers
    url = db.url.render_as_string(hide_password=False)
    t.queue.workers = LocalWorkers(w.count, t.cfg.run_name, url, w.threads, w.lease_s, t.checkpoint_root / "workers")
    return t.queue.workers


def _validate_if_due(t: Trainer, step: int) -> dict[int, dict[str, float]]:
    """{step: val metrics} when `step` is due for validation and not validated yet (rank 0 decides); else {}."""
    if not due(t.cfg, step):
        return {}
    done = None
    if t.dist.is_main:
        with transaction(t.db) as session:
            done = validated(session, t.run_id, step)
    if t.dist.broadcast(done):
        return {}
    return {step: validate(t.cfg, t.validation, step, t.policy, t.sampler, t.run)}


def grpo_step(t: Trainer, step: int) -> dict[str, float]:
    """One LANPO step; returns its metrics (rank 0 also writes them to run_metrics in the step's transaction)."""
    cfg, n, device = t.cfg, t.cfg.rollout.n, t.device
    phase = Phases(t.policy, step)

    # ------------------------------------------------------------------ 1-4. the producer half
    # problems and feedback contexts -> n rollouts per prompt -> rewards -> summaries of successful rollouts:
    # in this process, or (`workers`) by a rollout worker through the store, at most max_staleness updates behind
    if t.queue is not None:
        got = t.queue.take(step, phase, t.dist)  # rank 0 takes the step, each rank gets its share
    else:
        with phase("context"):
            prompts = feedback_prompts(cfg, step, t.run, t.scorer, t.problem_ids, t.tokenizer, t.dist)  # G prompts
        got = produce(cfg, t.sampler, t.summarizer, step, prompts, phase)
    prompts, groups, rollouts, graded = got.prompts, got.groups, got.rollouts, got.graded
    rewards = torch.tensor([g.reward for g in graded], dtype=torch.float32)  # (G*n,)

    # ------------------------------------------------------------------ 4b. meta-experiences (method = mel)
    with phase("mel"):
        # pairs -> lessons -> NLL; a worker's diagnoses and replays (`got.mel`) come with its groups
        meta = meta_experiences(cfg, t.sampler, device, step, prompts, groups, graded, made=got.mel)

    # ------------------------------------------------------------------ 5. group advantages (and replayed rows)
    replay = _draw_replays(t, step, prompts, phase)  # `[replay]`: stored rows join their groups; None: none
    with phase("prepare"):
        advantages = step_advantages(rewards, n, replay, cfg.replay).to(device)  # (G*n + R,); 0 without spread
        batch, behavior, rows = _rollout_batch(t, rollouts, replay, device)  # (B, P+T); (B, T) or None; replayed
        kept = behaviour_rows(cfg, t.policy, prompts, rollouts, [g.correct for g in graded], batch)  # for replay

    # ------------------------------------------------------------------ 6. reference log-probs + policy update
    with phase("sleep"):  # the engine's GPU memory is the update's until the sync wakes it (sleep_during_update)
        t.backend.sleep()
    stats = _update(t, step, batch, advantages, behavior, meta.nll, rows)  # epochs x minibatches, the reference's KL
    phase.took(ref_logp=stats.seconds_ref, update=stats.seconds_update)
    with phase("sync"):
        t.backend.sync()  # wakes the engine's weights, loads the updated policy, wakes its KV cache
    metrics = {**stats.as_metrics(), **prompts.feedback_metrics(n), **got.metrics}  # got: async/* from the queue
    metrics["lr"] = float(t.scheduler.get_last_lr()[0])
    metrics["autocast/bf16"] = float(autocast_dtype(cfg.grpo.autocast, device) is torch.bfloat16)  # "auto"'s choice

    # ------------------------------------------------------------------ 7. checkpoint (before the DB commit)
    saved = _save_policy(t, step, phase)  # a checkpoint, the weights staged for workers, or the version's hash

    # ------------------------------------------------------------------ 8. record: every rank's rows, one commit
    local = group_records(got, meta, kept)  # (G,) groups of n rollouts (with the tokens replay keeps)
    metrics.update({} if replay is None else replay.metrics(step, _fresh_tokens(t.dist, rollouts)))
    return _commit_step(t.store, t.policy, t.dist, step, phase, got, local, saved, metrics, replay)


def _update(
    t: Trainer,
    step: int,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    behavior: torch.Tensor | None,
    nll: NLLTerm | None,
    replay: ReplayRows | None = None,
) -> UpdateStats:
    """The GRPO update of `t.policy` on this rank's `batch`, seeded by the step (lanpo.train.consumer.update)."""
    cfg = t.cfg
    seed = mix_seed(cfg.seed, "update", step)
    return update_policy(
        t.policy,
        t.optimizer,
        t.scheduler,
        batch,
        advantages,
        cfg.grpo,
        seed,
        t.dist,
        behavior_logp=behavior,
        nll=nll,
        temperature=cfg.rollout.temperature,
        replay=replay,
    )


def _save_policy(t: Trainer, step: int, phase: Phases) -> tuple[Path | None, str] | None:
    """The step's policy version, before its commit: a checkpoint every `checkpoint.every` steps and at the last;
    between them the version's hash alone (a resume goes back to the last checkpointed step and rolls the store back
    to it: lanpo.feedback.lifecycle.open_run), and with rollout workers, who load the policy they serve from disk, its
    weights alone, staged for them. Returns (the checkpoint folder or None, the weights' sha256) on rank 0."""
    if t.cfg.checkpoint.due(step, t.cfg.steps):
        with phase("checkpoint"):  # every rank takes part (FSDP gathers the full weights); rank 0 writes
            return ckpt.save_checkpoint(t.checkpoint_root, step, t.policy, t.optimizer, t.scheduler, t.start, t.dist)
    if t.queue is not None:
        with phase("stage"):  # the same gather as a checkpoint's, no optimizer state: lanpo.train.plumbing.staged
            return staged.stage_policy(t.checkpoint_root, t.policy, t.start, t.dist)
    return ckpt.unsaved_version(t.policy, t.dist, getattr(t.backend, "expected", None))


def _commit_step(
    store: StepStore,
    policy: Policy,
    dist: Dist,
    step: int,
    phase: Phases,
    got: Produced,
    local: list[GroupRecord],
    saved: tuple[Path | None, str] | None,
    metrics: dict[str, float],
    replay: StepReplay | None = None,
) -> dict[str, float]:
    """Every rank's rows to rank 0, which writes them with the step's metrics in ONE transaction; the other
    ranks wait for that commit before the next step reads the store. Returns `metrics`, completed on rank 0.
    `replay`: the step's replayed rows, written as 'replayed' groups (rank 0 writes the step's whole draw)."""
    with phase("gather"):
        gathered = gather_step(dist, local, phase.timer.seconds, policy.replica_sha256() if dist.enabled else "")
    if gathered is not None and saved is not None:
        phase.timer.seconds = gathered.seconds  # the slowest rank's time per phase: the step waits for it
        metrics.update(record.rollout_metrics(gathered.rows))
        _write_step(store, step, phase, got, gathered.rows, saved, metrics, replay)
    dist.barrier()
    if gathered is not None and saved is not None:
        if saved[0] is not None:  # a checkpointed step
            ckpt.prune_checkpoints(store.checkpoint_root, store.keep_checkpoints, protect=step)
        _prune_staged(store)
    return metrics


def _prune_staged(store: StepStore) -> None:
    """Keep the staged weights of the newest `staged.KEEP` committed steps' versions (rank 0, after the commit: till
    then workers load the version before it)."""
    if not (store.checkpoint_root / staged.STAGED_DIR).is_dir():  # no workers, or no step between checkpoints yet
        return
    with transaction(store.run.db) as session:
        keep = steps_repo.newest_versions(session, store.run.run_id, staged.KEEP)
    staged.prune_staged(store.checkpoint_root, set(keep))


def _write_step(
    store: StepStore,
    step: int,
    phase: Phases,
    got: Produced,
    rows: list[GroupRecord],
    saved: tuple[Path | None, str],
    metrics: dict[str, float],
    replay: StepReplay | None = None,
) -> None:
    """Rank 0's one transaction: rows, MEL rows and replayed rows (one `lifecycle.write_groups`), metrics, policy
    version, the queued work it used (`workers`); `commit_step` last (the step exists once this commits). Adds what
    the writes report to `metrics`."""
    path, sha = saved
    run, policy_version_id = store.run, got.prompts.policy_version_id
    with transaction(run.db) as session:
        with phase("db_write"):
            written = lifecycle.write_groups(
                session,
                run,
                step,
                policy_version_id,
                rows,
                store.summary_author,
                store.max_total_per_step,
                mel=store.mel,
                replays=() if replay is None else replay.draws,
            )
        metrics.update(written.as_metrics())  # pool/*, and MEL's mel/* with pool/active after its lessons
        metrics.update(phase.timer.metrics())
        pv = steps_repo.add_policy_version(session, run.run_id, step, sha)
        steps_repo.set_served(session, pv, store.served_sha256)  # merged LoRA: what the engine serves for it
        if got.work_id is not None:  # trained on: a resume after a crash before this commit takes it again
            queue_repo.mark(session, got.work_id, "used")
        folder = None if path is None else str(path)  # None: a step between checkpoints (`checkpoint.every`)
        lifecycle.commit_step(session, run, step, pv, folder, metrics)  # LAST: the step exists once this commits


# --------------------------------------------------------------------------- helpers


def _draw_replays(t: Trainer, step: int, prompts: StepPrompts, phase: Phases) -> StepReplay | None:
    """`[replay]`'s rows for this step (lanpo.train.replay); None with replay off, and no phase timed then."""
    if not t.cfg.replay.enabled:
        return None
    with phase("replay"):
        return draw_step_replays(t.cfg, t.run, t.replay_sources, t.policy, t.tokenizer, step, prompts, t.dist)


def _fresh_tokens(dist: Dist, rollouts: list[Completion]) -> int:
    """The completion tokens of the step's fresh rollouts over every rank (`cost/trained_tokens`' fresh part)."""
    local = torch.tensor([sum(len(c.token_ids) for c in rollouts)], dtype=torch.float64)
    return int(dist.all_reduce_sum(local).item())


def _rollout_batch(
    t: Trainer, rollouts: list[Completion], replay: StepReplay | None, device: torch.device
) -> tuple[RolloutBatch, torch.Tensor | None, ReplayRows | None]:
    """The rollouts as one padded batch (input_ids (G*n, P+T), completion_mask (G*n, T)) and the engine's
    log-probs of their tokens (G*n, T) when it reports them (vLLM; else None); with replayed rows, those follow
    (B = G*n + R), the engine's log-probs padded with 0 for them, and which rows they are: on every rank when the
    step replays any row, on none when it replays none."""
    pad = t.tokenizer.pad_token_id
    if replay is None or not replay.total:
        batch = build_batch([c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts], pad, device)
        return batch, behavior_logprobs(rollouts, batch.completion_ids.shape[1], device), None
    n = t.cfg.rollout.n
    batch, replayed, stored, group = replay_batch(rollouts, replay, n, pad, device)
    engine = behavior_logprobs(rollouts, batch.completion_ids.shape[1], device)  # (G*n, T) or None
    if engine is not None:
        engine = torch.cat([engine, torch.zeros((replay.size, engine.shape[1]), device=device)])
    rc = t.cfg.replay
    return batch, engine, ReplayRows(replayed, stored, rc.correction, rc.shaping, group, len(rollouts) // n)


def group_records(got: Produced, meta: MetaStep, kept: dict[int, RolloutTokens] | None = None) -> list[GroupRecord]:
    """What the store keeps of this rank's step: one record per prompt with its n graded rollouts (and, `kept`, the
    tokens and behaviour log-probs `[replay]` keeps of some: lanpo.train.replay.behaviour_rows)."""
    records = record.group_records(got.prompts, got.groups, got.graded, got.summaries, meta.by_group)
    attach_tokens(records, kept or {}, len(got.groups[0]) if got.groups else 0)
    return records


def _progress(enabled: bool, start: int, steps: int) -> Any:
    if not enabled or start > steps:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=start - 1, desc="lanpo train", unit="step", dynamic_ncols=True)
