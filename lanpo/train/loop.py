"""The LANPO GRPO loop: one readable step, from sampling feedback contexts to the committed database rows.

    batch of problems -> feedback contexts from the store -> n rollouts per prompt -> rewards -> summaries
    -> group advantages -> reference log-probs -> clipped policy update -> checkpoint -> ONE transaction

Where this departs from textbook GRPO (and why):
- Language feedback: with probability p_t a problem's prompt carries an intra-sample context (the model's own
  earlier responses to the same problem, never their reward) or an inter-sample one (lessons summarised from
  other problems with relevance >= gamma). Rollouts of all modes share one group per prompt.
- Clip-higher (eps_low / eps_high), token-mean aggregation and a k3 KL penalty against the reference policy,
  which is the same model with the LoRA adapter disabled (no second copy in memory).
- With one PPO epoch and one minibatch the rollouts are on-policy: old_logp is the detached log-prob of the
  same forward that carries the gradient (ratio == 1), so no separate no-grad pass is spent on it.
- A group with zero reward spread gets advantage 0 (it contributes only the KL term).
- Successful rollouts are distilled into experiences by the summariser (default: the policy before this step's
  update); they join the pool in the same transaction as the attempts that produced them.

Crash safety: the checkpoint of step s is written (tmp dir + rename) before step s's transaction commits, and
`commit_step` is the transaction's last statement. Resume loads the last committed step's checkpoint.
Set LANPO_TRAIN_PAUSE_AT=phase:step (phases: generate, db_write) to make a step stop there (tests kill it).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine

from lanpo import prompts
from lanpo.db.engine import connect, transaction
from lanpo.db.repo import attempts as attempts_repo
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import experiences as experiences_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.errors import InputError
from lanpo.models import apply_chat
from lanpo.rewards import grade
from lanpo.rl.advantages import group_advantages
from lanpo.rollout import SamplingParams, make_backend
from lanpo.train import checkpoint as ckpt
from lanpo.train import record
from lanpo.train.batch import build_batch
from lanpo.train.config import TrainConfig
from lanpo.train.policy import load_base, load_policy
from lanpo.train.summarize import Candidate, choose_candidates, summarise
from lanpo.train.update import UpdateStats, cosine_schedule, update_policy

log = logging.getLogger(__name__)

PAUSE_ENV = "LANPO_TRAIN_PAUSE_AT"


@dataclass
class TrainResult:
    run_id: int
    run_name: str
    steps: list[int]  # steps completed by this call
    checkpoint_dir: Path
    metrics: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Trainer:
    """Everything a step needs, built once by `setup`."""

    cfg: TrainConfig
    engine: Engine
    run_id: int
    model: Any
    tokenizer: Any
    backend: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    problem_ids: list[int]
    scorer: str | None
    summarizer: tuple[Any, Any] | None  # (backend, tokenizer) or None when summaries are off
    checkpoint_root: Path


def train(
    config: TrainConfig,
    engine: Engine | None = None,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Run (or resume) GRPO training; returns the run and the metrics of the steps done by this call."""
    engine = engine or connect()
    trainer, start = setup(config, engine, resume)
    result = TrainResult(trainer.run_id, config.run_name, [], trainer.checkpoint_root)
    bar = _progress(progress, start, config.steps)
    try:
        for step in range(start, config.steps + 1):
            metrics = grpo_step(trainer, step)
            result.steps.append(step)
            result.metrics.append(metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy/mean']:.2f}")
            if on_step is not None:
                on_step(step, metrics)
    except BaseException:
        with transaction(engine) as session:
            runs_repo.finish_run(session, trainer.run_id, "failed")
        raise
    finally:
        if bar is not None:
            bar.close()
    with transaction(engine) as session:
        runs_repo.finish_run(session, trainer.run_id, "finished")
    return result


def setup(cfg: TrainConfig, engine: Engine, resume: bool) -> tuple[Trainer, int]:
    """Load the policy, build optimizer + schedule, create or resume the run; returns (trainer, first step)."""
    model, tokenizer = load_policy(cfg.model, cfg.lora, seed=cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.grpo.learning_rate, weight_decay=cfg.grpo.weight_decay)
    updates_per_step = cfg.grpo.ppo_epochs * _minibatches(cfg)
    scheduler = cosine_schedule(optimizer, cfg.steps * updates_per_step, cfg.grpo.warmup_ratio)
    root = cfg.checkpoint_root()
    with transaction(engine) as session:
        problem_ids = record.ensure_dataset(session, cfg.data)
        scorer = (
            record.resolve_scorer(session, cfg.feedback.scorer) if cfg.feedback.mode in ("inter", "both") else None
        )
        start = record.start_run(session, cfg, cfg.model.name, resume)
    if start.last_step is None:
        if cfg.sft.enabled and not cfg.model.init_adapter:
            from lanpo.train.sft import run_sft

            warm = run_sft(cfg, None, engine=engine, progress=False)
            ckpt.load_adapter_weights(model, warm.adapter_dir)
            log.info("SFT warm start: %d pairs, loss %.3f -> %.3f", warm.pairs, warm.losses[0], warm.losses[-1])
        # Step 0 = the initial adapter, committed like any other step so resume always has an anchor.
        path, sha = ckpt.save_checkpoint(root, 0, model, optimizer, scheduler)
        with transaction(engine) as session:
            pv = runs_repo.add_policy_version(session, start.run_id, 0, sha)
            runs_repo.commit_step(session, start.run_id, 0, pv, str(path))
        first = 1
    else:
        path = Path(start.checkpoint) if start.checkpoint else ckpt.step_dir(root, start.last_step)
        loaded = ckpt.load_checkpoint(path, model, optimizer, scheduler)
        if loaded.adapter_sha256 != start.adapter_sha256 or loaded.step != start.last_step:
            raise InputError(
                f"checkpoint {path} (step {loaded.step}, adapter {loaded.adapter_sha256[:12]}) does not match the "
                f"database (step {start.last_step}, adapter {str(start.adapter_sha256)[:12]})",
                hint="the run folder was changed after the run; restore it or start a new run_name",
            )
        log.info("resuming %s after committed step %d", cfg.run_name, start.last_step)
        first = start.last_step + 1
    backend = make_backend(cfg.rollout.backend, model, tokenizer)
    summarizer = None
    if cfg.summarizer.enabled and cfg.feedback.mode in ("inter", "both"):
        if cfg.summarizer.model == "policy":
            summarizer = (backend, tokenizer)
        else:
            from dataclasses import replace

            s_model, s_tok = load_base(replace(cfg.model, name=cfg.summarizer.model, init_adapter=None), cfg.seed)
            summarizer = (make_backend(cfg.rollout.backend, s_model, s_tok), s_tok)
    trainer = Trainer(
        cfg,
        engine,
        start.run_id,
        model,
        tokenizer,
        backend,
        optimizer,
        scheduler,
        problem_ids,
        scorer,
        summarizer,
        root,
    )
    return trainer, first


def grpo_step(t: Trainer, step: int) -> dict[str, float]:
    """One LANPO step; returns its metrics (also written to run_metrics in the step's transaction)."""
    cfg, n = t.cfg, t.cfg.rollout.n
    timings: dict[str, float] = {}
    clock = step_start = time.perf_counter()
    cpu_start = time.process_time()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    # ------------------------------------------------------------------ 1. problems and feedback contexts
    pids = record.batch_problem_ids(t.problem_ids, cfg.batch_size, cfg.seed, step)  # (G,)
    modes = record.choose_modes(pids, cfg.feedback.mode, cfg.feedback.p_t, cfg.seed, step)  # (G,)
    fb = cfg.feedback
    with transaction(t.engine) as session:
        rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(pids)))}
        intra_pids = sorted({p for p, m in zip(pids, modes, strict=True) if m == "intra"})
        inter_pids = sorted({p for p, m in zip(pids, modes, strict=True) if m == "inter"})
        ctx_seed = record.mix_seed(cfg.seed, "contexts", step)
        intra = contexts_repo.intra_contexts(session, intra_pids, fb.k, fb.pool_size, ctx_seed, run_id=t.run_id)
        inter = {}
        if inter_pids and t.scorer:
            inter = contexts_repo.inter_contexts(session, inter_pids, fb.k, fb.pool_size, ctx_seed, fb.gamma, t.scorer)
        prev_pv = record.policy_version_id(session, t.run_id, step - 1)
    items: list[list[Any]] = []
    for i, (pid, mode) in enumerate(zip(pids, modes, strict=True)):
        found = (intra if mode == "intra" else inter).get(pid, []) if mode != "zero_shot" else []
        if mode != "zero_shot" and not found:
            modes[i] = "zero_shot"  # nothing in the store yet: an honest from-scratch rollout
        items.append(list(found))
    prompt_texts = [
        _fit_prompt(t.tokenizer, mode, rows[pid].question, found, cfg.rollout.max_prompt_tokens)
        for pid, mode, found in zip(pids, modes, items, strict=True)
    ]
    for i, (_text, found) in enumerate(prompt_texts):
        items[i] = found
        if not found:
            modes[i] = "zero_shot"
    lap("context")

    # ------------------------------------------------------------------ 2. n rollouts per prompt
    _pause("generate", step)
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        seed=record.mix_seed(cfg.seed, "generate", step),
    )
    groups = t.backend.generate([text for text, _ in prompt_texts], n, params)  # G lists of n completions
    rollouts = [c for group in groups for c in group]  # (G*n,) flat, group by group
    lap("generate")

    # ------------------------------------------------------------------ 3. rewards
    flat_pids = [pid for pid in pids for _ in range(n)]  # (G*n,)
    flat_modes = [mode for mode in modes for _ in range(n)]  # (G*n,)
    graded = grade([c.text for c in rollouts], [rows[p].answer for p in flat_pids], flat_modes)
    rewards = torch.tensor([g.reward for g in graded], dtype=torch.float32)  # (G*n,)
    lap("reward")

    # ------------------------------------------------------------------ 4. summaries of successful rollouts
    summaries: dict[int, str] = {}
    if t.summarizer is not None:
        chosen = choose_candidates(
            [
                Candidate(i, p, rows[p].question, c.text, g.reward)
                for i, (p, c, g) in enumerate(zip(flat_pids, rollouts, graded, strict=True))
                if g.reward >= cfg.summarizer.min_reward
            ],
            per_problem=cfg.summarizer.max_new_per_step,
            total=cfg.summarizer.max_total_per_step,
        )
        s_backend, s_tok = t.summarizer
        s_cfg = cfg.summarizer
        texts = summarise(
            s_backend, s_tok, chosen, s_cfg.max_new_tokens, s_cfg.temperature, record.mix_seed(cfg.seed, "sum", step)
        )
        summaries = {c.index: s for c, s in zip(chosen, texts, strict=True) if s is not None}
    lap("summarize")

    # ------------------------------------------------------------------ 5. group advantages
    advantages = group_advantages(rewards, n)  # (G*n,), zero for groups without spread
    device = next(t.model.parameters()).device
    batch = build_batch(
        [c.prompt_token_ids for c in rollouts], [c.token_ids for c in rollouts], t.tokenizer.pad_token_id, device
    )  # input_ids (G*n, P+T), completion_mask (G*n, T)
    lap("prepare")

    # ------------------------------------------------------------------ 6. reference log-probs + policy update
    stats: UpdateStats = update_policy(
        t.model, t.optimizer, t.scheduler, batch, advantages.to(device), cfg.grpo, record.mix_seed(cfg.seed, step)
    )
    timings["ref_logp"], timings["update"] = stats.seconds_ref, stats.seconds_update
    clock = time.perf_counter()

    # ------------------------------------------------------------------ 7. checkpoint (before the DB commit)
    path, sha = ckpt.save_checkpoint(t.checkpoint_root, step, t.model, t.optimizer, t.scheduler)
    lap("checkpoint")

    # ------------------------------------------------------------------ 8. one transaction: rows, metrics, commit
    metrics = _metrics(graded, flat_modes, rollouts, stats, t.scheduler, summaries)
    with transaction(t.engine) as session:
        new_attempts = []
        for i, (pid, mode, c, g) in enumerate(zip(flat_pids, flat_modes, rollouts, graded, strict=True)):
            found = items[i // n]
            new_attempts.append(
                attempts_repo.NewAttempt(
                    problem_id=pid,
                    mode=mode,
                    prompt=prompt_texts[i // n][0],
                    response=c.text,
                    reward=g.reward,
                    correct=g.correct,
                    format_ok=g.format_ok,
                    prompt_tokens=len(c.prompt_token_ids),
                    completion_tokens=len(c.token_ids),
                    step=step,
                    run_id=t.run_id,
                    policy_version_id=prev_pv,
                    prompt_version=prompts.version_of(mode),
                    contexts=[item.ref(pos) for pos, item in enumerate(found)],
                )
            )
        attempt_ids = attempts_repo.record_attempts(session, new_attempts)
        _pause("db_write", step)
        added = experiences_repo.add_experiences(
            session,
            [
                experiences_repo.NewExperience(
                    problem_id=flat_pids[i],
                    summary=text,
                    reward=graded[i].reward,
                    source_attempt_id=attempt_ids[i],
                    run_id=t.run_id,
                    step=step,
                    author="policy" if cfg.summarizer.model == "policy" else cfg.summarizer.model,
                    policy_version_id=prev_pv,
                    prompt_version=prompts.SUMMARY_VERSION,
                )
                for i, text in sorted(summaries.items())
            ],
            cfg.store,
        )
        metrics["pool/added"] = float(len(added.experience_ids))
        metrics["pool/evicted"] = float(len(added.evicted_ids))
        metrics["pool/active"] = float(record.active_pool_size(session))
        lap("db_write")
        metrics.update({f"time/{k}": v for k, v in timings.items()})
        metrics["time/step"] = time.perf_counter() - step_start
        metrics["time/cpu_step"] = time.process_time() - cpu_start  # all threads: > wall when the cores are ours
        metrics["time/pool_share"] = (timings["context"] + timings["db_write"]) / metrics["time/step"]
        runs_repo.record_metrics(session, t.run_id, step, metrics)
        pv = runs_repo.add_policy_version(session, t.run_id, step, sha)
        runs_repo.commit_step(session, t.run_id, step, pv, str(path))  # LAST: the step exists once this commits
    ckpt.prune_checkpoints(t.checkpoint_root, cfg.keep_checkpoints, protect=step)
    return metrics


# --------------------------------------------------------------------------- helpers


def _fit_prompt(tokenizer: Any, mode: str, question: str, found: list[Any], limit: int) -> tuple[str, list[Any]]:
    """The chat prompt for `mode`, dropping context items (oldest-drawn last) until it fits `limit` tokens."""
    found = list(found)
    while True:
        text = apply_chat(tokenizer, prompts.build_messages(mode, question, found))
        if not found or len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            return text, found
        found = found[:-1]


def _metrics(
    graded: list[Any], modes: list[str], rollouts: list[Any], stats: UpdateStats, scheduler: Any, summaries: dict
) -> dict[str, float]:
    out: dict[str, float] = {
        "reward/mean": _mean([g.reward for g in graded]),
        "accuracy/mean": _mean([float(g.correct) for g in graded]),
        "format/rate": _mean([float(g.format_ok) for g in graded]),
        "response_len/mean": _mean([float(len(c.token_ids)) for c in rollouts]),
        "response_len/truncated": _mean([float(c.finish_reason == "length") for c in rollouts]),
        "loss": stats.loss,
        "kl": stats.kl,
        "entropy": stats.entropy,
        "grad_norm": stats.grad_norm,
        "clip_frac": stats.clip_frac,
        "groups/zero_spread": stats.zero_spread,
        "lr": float(scheduler.get_last_lr()[0]),
        "pool/summaries": float(len(summaries)),
    }
    for mode in prompts.MODES:
        picked = [g for g, m in zip(graded, modes, strict=True) if m == mode]
        out[f"count/{mode}"] = float(len(picked))
        if picked:
            out[f"reward/{mode}"] = _mean([g.reward for g in picked])
            out[f"accuracy/{mode}"] = _mean([float(g.correct) for g in picked])
    return out


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def _minibatches(cfg: TrainConfig) -> int:
    rollouts = cfg.batch_size * cfg.rollout.n
    return rollouts // cfg.grpo.minibatch_size if cfg.grpo.minibatch_size else 1


def _pause(phase: str, step: int) -> None:
    """Test hook: with LANPO_TRAIN_PAUSE_AT=phase:step, announce on stderr and sleep (the test kills us)."""
    if os.environ.get(PAUSE_ENV) == f"{phase}:{step}":
        print(f"lanpo-paused {phase}:{step}", file=sys.stderr, flush=True)
        time.sleep(3600)


def _progress(enabled: bool, start: int, steps: int) -> Any:
    if not enabled or start > steps:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=start - 1, desc="lanpo train", unit="step", dynamic_ncols=True)
