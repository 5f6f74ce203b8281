"""The trainer's side of the store: run start / resume bookkeeping, problem batches, and the per-step records.

Repository functions (lanpo.db.repo) do the writing; this module decides *what* a step writes. Every function
takes a session and never opens one: the loop owns the one-transaction-per-step boundary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo import prompts
from lanpo.config import to_mapping
from lanpo.db.models import PolicyVersion, RelevanceScore, Run, RunStep
from lanpo.db.repo import attempts as attempts_repo
from lanpo.db.repo import experiences as experiences_repo
from lanpo.db.repo import pools as pools_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo.attempts import ContextRef
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import ConfigError, InputError
from lanpo.train.config import DataConfig, TrainConfig

log = logging.getLogger(__name__)


def mix_seed(*parts: int | str) -> int:
    """A stable 63-bit seed from parts (Python's hash() is salted per process; this is not)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# --------------------------------------------------------------------------- problems


def ensure_dataset(session: Session, data: DataConfig) -> list[int]:
    """Problem ids of `data.dataset`, generating it from reasoning-gym first when empty and `data.task` is set."""
    if data.dataset in problems_repo.known_datasets(session):
        ids = problems_repo.problem_ids(session, data.dataset)
        if ids:
            return ids
    if not data.task:
        raise InputError(
            f"dataset {data.dataset!r} has no problems",
            hint=f"import one (`lanpo data import FILE --dataset {data.dataset}`) or set data.task to generate it",
        )
    from lanpo.data.generate import generate_problems
    from lanpo.data.importer import parse_line

    records = generate_problems(data.task, n=data.n, seed=data.seed, options=dict(data.task_options))
    problems_repo.upsert_problems(session, data.dataset, [parse_line(json.dumps(r)) for r in records])
    return problems_repo.problem_ids(session, data.dataset)


def batch_problem_ids(all_ids: Sequence[int], batch_size: int, seed: int, step: int) -> list[int]:
    """The problems of `step` (1-based): epochs of seeded permutations, so a resumed run sees the same batches."""
    n = len(all_ids)
    out = []
    for i in range((step - 1) * batch_size, step * batch_size):
        epoch, pos = divmod(i, n)
        order = np.random.default_rng(mix_seed(seed, "epoch", epoch)).permutation(n)
        out.append(int(all_ids[order[pos]]))
    return out


def choose_modes(problem_ids: Sequence[int], mode: str, p_t: float, seed: int, step: int) -> list[str]:
    """Per problem: a feedback mode with probability p_t (intra / inter, or either for `both`), else zero_shot."""
    rng = np.random.default_rng(mix_seed(seed, "modes", step))
    out = []
    for _ in problem_ids:
        use_feedback = rng.random() < p_t
        pick_inter = rng.random() < 0.5
        if mode == "none" or not use_feedback:
            out.append("zero_shot")
        elif mode == "both":
            out.append("inter" if pick_inter else "intra")
        else:
            out.append(mode)
    return out


def resolve_scorer(session: Session, scorer: str | None) -> str | None:
    """The relevance scorer inter mode reads: the configured one, or the only one present (None: none yet)."""
    if scorer:
        return scorer
    found = list(session.scalars(sa.select(RelevanceScore.scorer).distinct().limit(3)))
    if len(found) > 1:
        raise ConfigError(
            f"feedback.scorer is unset and relevance_scores holds several scorers ({', '.join(found)})",
            hint="set feedback.scorer to one of them",
        )
    return found[0] if found else None


# --------------------------------------------------------------------------- runs


@dataclass
class RunStart:
    run_id: int
    pool: PoolRow  # the experience pool the run reads and writes
    last_step: int | None  # last committed step (None: nothing committed yet, start from scratch)
    checkpoint: str | None
    adapter_sha256: str | None


def start_run(session: Session, cfg: TrainConfig, model_name: str, resume: bool) -> RunStart:
    """Create the run and its pool, or (resume) find it, roll back its uncommitted rows and say where to continue."""
    run = session.scalar(sa.select(Run).where(Run.name == cfg.run_name))
    if run is None:
        pool = pools_repo.ensure_pool(session, cfg.pool_name(), cfg.store)
        run = runs_repo.create_run(session, cfg.run_name, "train", to_mapping(cfg), model_name, pool_id=pool.id)
        return RunStart(run.id, pool, None, None, None)
    if not resume:
        raise ConfigError(
            f"a run named {cfg.run_name!r} already exists",
            hint="pass --resume to continue it, or set run_name (e.g. `--set run_name=NEW`) for a new run",
        )
    pool = pools_repo.ensure_pool(session, cfg.pool_name(), cfg.store)
    if run.pool_id != pool.id:
        raise ConfigError(
            f"run {cfg.run_name!r} writes pool #{run.pool_id}, but this config names pool {pool.name!r}",
            hint="resume with the [store] settings the run started with",
        )
    last = runs_repo.last_committed_step(session, run.id)
    rolled = runs_repo.rollback_uncommitted(session, run.id, last)
    if rolled.groups or rolled.steps or rolled.experiences:
        log.warning("resume: rolled back uncommitted rows after step %s: %s", last, rolled)
    runs_repo.finish_run(session, run.id, "running")
    if last is None:
        return RunStart(run.id, pool, None, None, None)
    row = session.execute(
        sa.select(RunStep.checkpoint, PolicyVersion.adapter_sha256)
        .join(PolicyVersion, PolicyVersion.id == RunStep.policy_version_id, isouter=True)
        .where(RunStep.run_id == run.id, RunStep.step == last)
    ).one()
    return RunStart(run.id, pool, last, row.checkpoint, row.adapter_sha256)


def policy_version_id(session: Session, run_id: int, step: int) -> int:
    pv = session.scalar(sa.select(PolicyVersion.id).where(PolicyVersion.run_id == run_id, PolicyVersion.step == step))
    if pv is None:
        raise InputError(f"run {run_id} has no policy version for step {step}")
    return pv


# --------------------------------------------------------------------------- one step's rows


@dataclass
class RolloutRecord:
    """One rollout as the store keeps it: the response and its grade (its prompt is its group's)."""

    response: str
    reward: float
    correct: bool
    format_ok: bool
    completion_tokens: int
    truncated: bool
    summary: str | None = None  # the lesson distilled from it, when it was chosen for summarising


@dataclass
class GroupRecord:
    """One prompt, the context it carried and its n rollouts (what every rank sends to rank 0 for the commit)."""

    problem_id: int
    mode: str
    prompt: str
    prompt_tokens: int
    contexts: list[ContextRef]
    rollouts: list[RolloutRecord]


@dataclass
class StepWrite:
    attempts: int
    added: int
    evicted: int
    pool_active: int


def write_step_rows(
    session: Session,
    run_id: int,
    pool: PoolRow,
    step: int,
    policy_version_id: int,
    groups: Sequence[GroupRecord],
    summary_author: str,
) -> StepWrite:
    """Groups with their attempts and contexts, then experiences summarised from them (capacity enforced inside)."""
    attempt_ids = attempts_repo.record_groups(
        session,
        [
            attempts_repo.NewGroup(
                problem_id=g.problem_id,
                mode=g.mode,
                prompt=g.prompt,
                prompt_version=prompts.version_of(g.mode),
                prompt_tokens=g.prompt_tokens,
                step=step,
                run_id=run_id,
                policy_version_id=policy_version_id,
                contexts=g.contexts,
                attempts=[
                    attempts_repo.NewAttempt(
                        response=r.response,
                        reward=r.reward,
                        correct=r.correct,
                        format_ok=r.format_ok,
                        completion_tokens=r.completion_tokens,
                    )
                    for r in g.rollouts
                ],
            )
            for g in groups
        ],
    )
    pause("db_write", step)
    added = experiences_repo.add_experiences(
        session,
        pool,
        [
            experiences_repo.NewExperience(
                problem_id=g.problem_id,
                summary=r.summary,
                reward=r.reward,
                source_attempt_id=attempt_id,
                run_id=run_id,
                step=step,
                author=summary_author,
                policy_version_id=policy_version_id,
                prompt_version=prompts.SUMMARY_VERSION,
            )
            for g, ids in zip(groups, attempt_ids, strict=True)
            for r, attempt_id in zip(g.rollouts, ids, strict=True)
            if r.summary
        ],
    )
    return StepWrite(
        sum(len(ids) for ids in attempt_ids),
        len(added.experience_ids),
        len(added.evicted_ids),
        pools_repo.active_size(session, pool.id),
    )


def rollout_metrics(groups: Sequence[GroupRecord]) -> dict[str, float]:
    """Reward and accuracy overall and by mode, format rate, response length, summaries."""

    def mean(values: list[float]) -> float:
        return float(sum(values) / len(values)) if values else math.nan

    rollouts = [r for g in groups for r in g.rollouts]

    out = {
        "reward/mean": mean([r.reward for r in rollouts]),
        "accuracy/mean": mean([float(r.correct) for r in rollouts]),
        "format/rate": mean([float(r.format_ok) for r in rollouts]),
        "response_len/mean": mean([float(r.completion_tokens) for r in rollouts]),
        "response_len/truncated": mean([float(r.truncated) for r in rollouts]),
        "pool/summaries": float(sum(1 for r in rollouts if r.summary)),
    }
    for mode in prompts.MODES:
        picked = [r for g in groups if g.mode == mode for r in g.rollouts]
        out[f"count/{mode}"] = float(len(picked))
        if picked:
            out[f"reward/{mode}"] = mean([r.reward for r in picked])
            out[f"accuracy/{mode}"] = mean([float(r.correct) for r in picked])
    return out


PAUSE_ENV = "LANPO_TRAIN_PAUSE_AT"


def pause(phase: str, step: int) -> None:
    """Test hook: with LANPO_TRAIN_PAUSE_AT=phase:step, announce on stderr and sleep (the test kills us)."""
    if os.environ.get(PAUSE_ENV) == f"{phase}:{step}":
        print(f"lanpo-paused {phase}:{step}", file=sys.stderr, flush=True)
        time.sleep(3600)
