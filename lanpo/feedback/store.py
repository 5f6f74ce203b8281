"""A trainer's place in the store: the run's reference (store, run, pool), and what a run reads before any model
loads (its problems, generated on first use, or a dataset's as a whole; the relevance inter feedback draws by).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.connection import transaction
from lanpo.db.repo import contexts as contexts_repo
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo.pools import PoolRow
from lanpo.db.repo.problems import ProblemRow
from lanpo.errors import ConfigError, InputError
from lanpo.feedback.config import DataConfig, FeedbackConfig
from lanpo.feedback_modes import asks_inter


@dataclass(frozen=True)
class RunRef:
    """Where a step's rows go: the store, the run, and the experience pool the run reads and writes."""

    db: Engine
    run_id: int
    pool: PoolRow


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


def dataset_problems(db: Engine, dataset: str) -> list[ProblemRow]:
    """Every problem of `dataset`; InputError for a bad name or a dataset the store does not hold."""
    problems_repo.check_dataset_name(dataset)
    with transaction(db) as session:
        problems_repo.require_dataset(session, dataset)
        return problems_repo.problems_of_dataset(session, dataset)


def require_relevance(session: Session, feedback: FeedbackConfig, dataset: str) -> None:
    """What inter feedback needs from relevance_scores before any model loads: the named scorer, or (none named,
    empty draws not allowed) some score at all. gamma 0 reads no relevance, so it needs none."""
    inter = feedback.inter
    if not (asks_inter(feedback.mode) and inter.reads_relevance):
        return
    if inter.scorer:
        contexts_repo.require_scorer(session, inter.scorer)
    elif not inter.allow_empty and not contexts_repo.scorers(session):
        raise ConfigError(
            f"feedback.mode = {feedback.mode} draws inter-sample lessons by relevance, and relevance_scores "
            "holds no score yet: every inter prompt would go zero-shot",
            hint=f"lanpo relevance build --dataset {dataset} --judge MODEL (then set feedback.inter.scorer), or "
            "set feedback.inter.allow_empty = true",
        )


def resolve_scorer(session: Session, scorer: str | None) -> str | None:
    """The relevance scorer inter mode reads: the configured one, or the only one present (None: none yet)."""
    if scorer:
        return scorer
    found = contexts_repo.scorers(session)
    if len(found) > 1:
        raise ConfigError(
            f"feedback.inter.scorer is unset and relevance_scores holds several scorers ({', '.join(found)})",
            hint="set feedback.inter.scorer to one of them",
        )
    return found[0] if found else None
