"""Putting inference into the store: questions as problems, an `infer` / `eval` run, every turn as an attempt.

- Questions that are not in the store are imported as problems of a dataset (`lanpo infer`: `infer-<file
  stem>` unless `--dataset` names one), keyed by their id; a stored problem with the same id but other text is
  an error (nothing is overwritten).
- Every turn is an attempt of the run with its mode (`zero_shot`, `retrieval`, `self_correct`), so the
  `run_rewards` / `experience_usage` views cover inference and evaluation too. `step` holds the turn index
  (0: the answer; in self-correct 0 is the first attempt and 1 the revision, whose `attempt_contexts` row
  names the first attempt). Retrieval attempts list the experience versions in their prompt, with relevance.
- The final answer of a sample is the attempt no other attempt of the run uses as context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy.orm import Session

from lanpo.db.repo.attempts import ContextRef, NewAttempt, record_attempts
from lanpo.db.repo.problems import ProblemIn, check_dataset_name, upsert_problems
from lanpo.db.repo.runs import add_policy_version, create_run
from lanpo.db.sqlfiles import load
from lanpo.errors import InputError
from lanpo.inference.engine import Solution, Turn
from lanpo.inference.io import Question


def import_questions(session: Session, dataset: str, questions: Sequence[Question]) -> list[Question]:
    """Upsert `questions` as problems of `dataset` and return them with `problem_id` set (same order)."""
    check_dataset_name(dataset)
    result = upsert_problems(
        session, dataset, [ProblemIn(q.id, q.question, q.answer, dict(q.metadata)) for q in questions]
    )
    if result.refused:
        shown = ", ".join(result.refused[:5])
        raise InputError(
            f"dataset {dataset!r} already holds problem(s) {shown} with a different question or answer",
            hint="give the input a fresh dataset name (--dataset NAME) or fresh ids",
        )
    return attach_problem_ids(session, dataset, questions)


def attach_problem_ids(session: Session, dataset: str, questions: Sequence[Question]) -> list[Question]:
    ids = {
        r.external_id: int(r.id)
        for r in session.execute(
            load("queries/inference_problem_ids"), {"dataset": dataset, "external_ids": [q.id for q in questions]}
        )
    }
    missing = [q.id for q in questions if q.id not in ids]
    if missing:
        raise InputError(f"dataset {dataset!r} has no problem(s) {', '.join(missing[:5])}")
    return [replace(q, problem_id=ids[q.id]) for q in questions]


def dataset_questions(session: Session, dataset: str, limit: int | None = None) -> list[Question]:
    """The problems of `dataset` (first `limit` by id) as questions; InputError when it has none."""
    rows = session.execute(load("queries/inference_dataset_problems"), {"dataset": dataset, "limit": limit}).all()
    if not rows:
        raise InputError(
            f"dataset {dataset!r} has no problems", hint=f"import it: lanpo data import FILE --dataset {dataset}"
        )
    return [Question(r.external_id, r.question, r.answer, dict(r.metadata or {}), int(r.id)) for r in rows]


def start_run(
    session: Session, name: str, kind: str, config: dict, model: str, adapter_sha256: str | None
) -> tuple[int, int | None]:
    """Create the run (and its policy version when an adapter is served); returns (run id, policy version id)."""
    run = create_run(session, name, kind, config=config, model=model)
    version = add_policy_version(session, run.id, 0, adapter_sha256) if adapter_sha256 else None
    return run.id, version


def _attempt(q: Question, mode: str, turn: Turn, step: int, run_id: int, policy_version_id: int | None) -> NewAttempt:
    assert q.problem_id is not None
    return NewAttempt(
        problem_id=q.problem_id,
        mode=mode,
        prompt=turn.prompt,
        response=turn.response,
        reward=turn.reward,
        correct=turn.correct,
        format_ok=turn.format_ok,
        prompt_tokens=turn.prompt_tokens,
        completion_tokens=turn.completion_tokens,
        step=step,
        run_id=run_id,
        policy_version_id=policy_version_id,
        prompt_version=turn.prompt_version,
    )


def record_solutions(
    session: Session, solutions: Sequence[Solution], run_id: int, policy_version_id: int | None = None
) -> list[int]:
    """Store every turn of `solutions` as attempts of `run_id`; returns the final-turn attempt ids."""
    for s in solutions:
        if s.question.problem_id is None:
            raise InputError(f"question {s.question.id!r} is not in the store: import it first (import_questions)")
    # Turn by turn: a later turn's context names the attempt id of the turn before it.
    depth = max((len(sample.turns) for s in solutions for sample in s.samples), default=0)
    previous: dict[tuple[int, int], int] = {}
    for step in range(depth):
        keys, rows = [], []
        for i, s in enumerate(solutions):
            for j, sample in enumerate(s.samples):
                if step >= len(sample.turns):
                    continue
                row = _attempt(s.question, s.mode, sample.turns[step], step, run_id, policy_version_id)
                if step > 0:
                    row.contexts = [ContextRef(position=0, context_attempt_id=previous[(i, j)])]
                elif s.experiences:
                    row.contexts = [
                        ContextRef(position=p, experience_version_id=e.experience_version_id, score=e.relevance)
                        for p, e in enumerate(s.experiences)
                    ]
                keys.append((i, j))
                rows.append(row)
        previous.update(zip(keys, record_attempts(session, rows), strict=True))
    return [previous[(i, j)] for i, s in enumerate(solutions) for j in range(len(s.samples))]
