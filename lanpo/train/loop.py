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
- A group with zero reward spread gets advantage 0 (it contributes only the KL term); with
  `grpo.skip_zero_spread` (DAPO-style) such groups are left out of the update altogether.
- Log-probs are taken for completion tokens only (`logits_to_keep`): the vocabulary projection never runs over
  prompt tokens.
- Successful rollouts are distilled into experiences by the summariser (default: the policy before this step's
  update); they join the pool in the same transaction as the attempts that produced them.

Crash safety: the checkpoint of step s is written (tmp dir + rename) before step s's transaction commits, and
`commit_step` is the transaction's last statement. Resume loads the last committed step's checkpoint.
Set LANPO_TRAIN_PAUSE_AT=phase:step (phases: generate, db_write) to make a step stop there (tests kill it).
Under torchrun each rank runs this same step on its share of the problems (see lanpo.train.dist).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.engine import Engine

from lanpo import prompts
from lanpo.db.engine import connect, transaction
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.models import adapter_sha256, apply_chat
from lanpo.rewards import grade
from lanpo.rl.advantages import group_advantages
from lanpo.rollout import SamplingParams
from lanpo.train import checkpoint as ckpt
from lanpo.train import record
from lanpo.train.batch import build_batch
from lanpo.train.config import TrainConfig
from lanpo.train.record import PAUSE_ENV, GroupRecord, RolloutRecord, pause
from lanpo.train.state import Trainer, setup
from lanpo.train.summarize import Candidate, choose_candidates, summarise
from lanpo.train.update import UpdateStats, update_policy

log = logging.getLogger(__name__)

__all__ = ["PAUSE_ENV", "TrainResult", "grpo_step", "train"]


@dataclass
class TrainResult:
    run_id: int
    run_name: str
    steps: list[int]  # steps completed by this call
    checkpoint_dir: Path
    metrics: list[dict[str, float]] = field(default_factory=list)


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
    main = trainer.dist.is_main
    result = TrainResult(trainer.run_id, config.run_name, [], trainer.checkpoint_root)
    bar = _progress(progress and main, start, config.steps)
    try:
        for step in range(start, config.steps + 1):
            metrics = grpo_step(trainer, step)
            result.steps.append(step)
            result.metrics.append(metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy/mean']:.2f}")
            if on_step is not None and main:
                on_step(step, metrics)
    except BaseException:
        if main:
            with transaction(engine) as session:
                runs_repo.finish_run(session, trainer.run_id, "failed")
        raise
    finally:
        if bar is not None:
            bar.close()
    if main:
        with transaction(engine) as session:
            runs_repo.finish_run(session, trainer.run_id, "finished")
    return result


def grpo_step(t: Trainer, step: int) -> dict[str, float]:
    """One LANPO step; returns its metrics (rank 0 also writes them to run_metrics in the step's transaction)."""
    cfg, n, dist = t.cfg, t.cfg.rollout.n, t.dist
    timings: dict[str, float] = {}
    clock = step_start = time.perf_counter()
    cpu_start = time.process_time()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    # ------------------------------------------------------------------ 1. problems and feedback contexts
    all_pids = record.batch_problem_ids(t.problem_ids, cfg.batch_size, cfg.seed, step)  # (G_all,)
    all_modes = record.choose_modes(all_pids, cfg.feedback.mode, cfg.feedback.p_t, cfg.seed, step)
    pids, modes = all_pids[dist.rank :: dist.world], all_modes[dist.rank :: dist.world]  # (G,) this rank's share
    fb = cfg.feedback
    with transaction(t.engine) as session:
        rows = {p.id: p for p in problems_repo.problems_by_ids(session, sorted(set(pids)))}
        intra_pids = sorted({p for p, m in zip(pids, modes, strict=True) if m == "intra"})
        inter_pids = sorted({p for p, m in zip(pids, modes, strict=True) if m == "inter"})
        ctx_seed = record.mix_seed(cfg.seed, "contexts", step)
        intra = contexts_repo.intra_contexts(session, intra_pids, fb.k, fb.pool_size, ctx_seed, run_id=t.run_id)
        inter = {}
        if inter_pids and t.scorer:
            inter = contexts_repo.inter_contexts(
                session, inter_pids, fb.k, fb.pool_size, ctx_seed, fb.gamma, t.scorer, t.pool.id
            )
        prev_pv = record.policy_version_id(session, t.run_id, step - 1)  # the weights that generate this step
    prompt_texts: list[str] = []
    items: list[list[Any]] = []
    for i, (pid, mode) in enumerate(zip(pids, modes, strict=True)):
        found = {"intra": intra, "inter": inter}.get(mode, {}).get(pid, [])
        text, kept = _fit_prompt(t.tokenizer, mode, rows[pid].question, list(found), cfg.rollout.max_prompt_tokens)
        if not kept:
            modes[i] = "zero_shot"  # nothing in the store yet (or nothing fits): an honest from-scratch rollout
        prompt_texts.append(text)
        items.append(kept)
    lap("context")

    # ------------------------------------------------------------------ 2. n rollouts per prompt
    pause("generate", step)
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        seed=record.mix_seed(cfg.seed, "generate", step, dist.rank),
    )
    groups = t.backend.generate(prompt_texts, n, params)  # G lists of n completions
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
        s_cfg = cfg.summarizer
        chosen = choose_candidates(
            [
                Candidate(i, p, rows[p].question, c.text, g.reward)
                for i, (p, c, g) in enumerate(zip(flat_pids, rollouts, graded, strict=True))
                if g.reward >= s_cfg.min_reward
            ],
            per_problem=s_cfg.max_new_per_step,
            total=-(-s_cfg.max_total_per_step // dist.world) if s_cfg.max_total_per_step else 0,
        )
        s_backend, s_tok = t.summarizer
        seed = record.mix_seed(cfg.seed, "summarize", step, dist.rank)
        texts = summarise(s_backend, s_tok, chosen, s_cfg.max_new_tokens, s_cfg.temperature, seed)
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
        t.model,
        t.optimizer,
        t.scheduler,
        batch,
        advantages.to(device),
        cfg.grpo,
        record.mix_seed(cfg.seed, "update", step),
        dist,
    )
    timings["ref_logp"], timings["update"] = stats.seconds_ref, stats.seconds_update
    clock = time.perf_counter()

    # ------------------------------------------------------------------ 7. gather this step's rows on rank 0
    local = [
        GroupRecord(
            problem_id=pid,
            mode=mode,
            prompt=prompt_texts[g],
            prompt_tokens=len(groups[g][0].prompt_token_ids),
            contexts=[item.ref(pos) for pos, item in enumerate(items[g])],
            rollouts=[
                RolloutRecord(
                    response=c.text,
                    reward=graded[g * n + j].reward,
                    correct=graded[g * n + j].correct,
                    format_ok=graded[g * n + j].format_ok,
                    completion_tokens=len(c.token_ids),
                    truncated=c.finish_reason == "length",
                    summary=summaries.get(g * n + j),
                )
                for j, c in enumerate(groups[g])
            ],
        )
        for g, (pid, mode) in enumerate(zip(pids, modes, strict=True))
    ]  # (G,) groups of n rollouts
    # Every rank must hold the same adapter after the update (gradients were summed); checked here, cheaply.
    rank_sha = adapter_sha256(t.model) if dist.enabled else ""
    gathered = dist.gather((local, timings, rank_sha))
    metrics = {
        **stats.as_metrics(),
        "lr": float(t.scheduler.get_last_lr()[0]),
    }
    if not dist.is_main:
        dist.barrier()  # wait for rank 0's commit before the next step reads the store
        return metrics
    assert gathered is not None
    step_groups = [g for rank_groups, _, _ in gathered for g in rank_groups]
    if len({sha for _, _, sha in gathered}) > 1:
        raise RuntimeError(f"step {step}: the ranks' adapters diverged after the update")
    # phase times: the slowest rank's (the step waits for it)
    for key in list(timings):
        timings[key] = max(rank_timings[key] for _, rank_timings, _ in gathered)
    metrics.update(record.rollout_metrics(step_groups))
    lap("gather")

    # ------------------------------------------------------------------ 8. checkpoint (before the DB commit)
    path, sha = ckpt.save_checkpoint(t.checkpoint_root, step, t.model, t.optimizer, t.scheduler)
    lap("checkpoint")

    # ------------------------------------------------------------------ 9. one transaction: rows, metrics, commit
    author = "policy" if cfg.summarizer.model == "policy" else cfg.summarizer.model
    with transaction(t.engine) as session:
        written = record.write_step_rows(session, t.run_id, t.pool, step, prev_pv, step_groups, author)
        lap("db_write")
        metrics["pool/added"], metrics["pool/evicted"] = float(written.added), float(written.evicted)
        metrics["pool/active"] = float(written.pool_active)
        metrics.update({f"time/{k}": v for k, v in timings.items()})
        metrics["time/step"] = time.perf_counter() - step_start
        metrics["time/cpu_step"] = time.process_time() - cpu_start  # all threads: > wall when the cores are ours
        metrics["time/pool_share"] = (timings["context"] + timings["db_write"]) / metrics["time/step"]
        runs_repo.record_metrics(session, t.run_id, step, metrics)
        pv = runs_repo.add_policy_version(session, t.run_id, step, sha)
        runs_repo.commit_step(session, t.run_id, step, pv, str(path))  # LAST: the step exists once this commits
    dist.barrier()
    ckpt.prune_checkpoints(t.checkpoint_root, cfg.keep_checkpoints, protect=step)
    return metrics


# --------------------------------------------------------------------------- helpers


def _fit_prompt(tokenizer: Any, mode: str, question: str, found: list[Any], limit: int) -> tuple[str, list[Any]]:
    """The chat prompt for `mode`, dropping context items (last drawn first) until it fits `limit` tokens."""
    while True:
        text = apply_chat(tokenizer, prompts.build_messages(mode, question, found))
        if not found or len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            return text, found
        found = found[:-1]


def _progress(enabled: bool, start: int, steps: int) -> Any:
    if not enabled or start > steps:
        return None
    from tqdm import tqdm

    return tqdm(total=steps, initial=start - 1, desc="lanpo train", unit="step", dynamic_ncols=True)
