"""Putting inference into the store: questions as problems, an `infer` / `eval` run, every turn as an attempt.

- Questions that are not in the store are imported as problems of a dataset (`lanpo infer`: `infer-<file
  stem>` unless `--dataset` names one), keyed by their id; a stored problem with the same id but other text is
  an error (nothing is overwritten).
- Every turn is an attempt of the run with its mode (`zero_shot`, `retrieval`, `self_correct`), so the
  `run_rewards` / `experience_usage` views cover inference and evaluation too. The k samples of one prompt form
  one rollout group; `step` holds the turn index (0: the answer; in self-correct 0 is the first attempt and 1
  the revision, one group per sample whose `group_contexts` row names the first attempt). Retrieval groups list
  the experience versions in their prompt, with relevance.
- The final answer of a sample is the attempt no group of the run uses as context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy.orm import Session

from lanpo.db.repo.attempts import ContextRef, NewAttempt, NewGroup, record_groups
from lanpo.db.repo.problems import Question, check_dataset_name, require_dataset, upsert_problems
from lanpo.db.repo.runs import create_run
from lanpo.db.repo.steps import add_policy_version
from lanpo.db.sqlfiles import load
from lanpo.errors import InputError
from lanpo.inference.config import STORED_MODE
from lanpo.inference.results import Solution, Turn


def import_questions(session: Session, dataset: str, questions: Sequence[Question]) -> list[Question]:
    """Upsert `questions` as problems of `dataset` and return them with `problem_id` set (same order)."""
    check_dataset_name(dataset)
    result = upsert_problems(session, dataset, list(questions))
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
            load("queries/inference_problem_ids"),
            {"dataset": dataset, "external_ids": [q.external_id for q in questions]},
        )
    }
    missing = [q.external_id for q in questions if q.external_id not in ids]
    if missing:
        raise InputError(f"dataset {dataset!r} has no problem(s) {', '.join(missing[:5])}")
    return [replace(q, problem_id=ids[q.external_id]) for q in questions]


def dataset_questions(session: Session, dataset: str, limit: int | None = None) -> list[Question]:
    """The problems of `dataset` (first `limit` by id) as questions; InputError when it has none."""
    rows = session.execute(load("queries/inference_dataset_problems"), {"dataset": dataset, "limit": limit}).all()
    if not rows:
        require_dataset(session, dataset)  # an unknown name: the error lists the datasets there are
        raise InputError(
            f"dataset {dataset!r} has no problems", hint=f"import it: lanpo data import FILE --dataset {dataset}"
        )
    return [Question(r.external_id, r.question, r.answer, dict(r.metadata or {}), int(r.id)) for r in rows]


def start_run(
    session: Session,
    name: str,
    kind: str,
    config: dict,
    model: str,
    adapter_sha256: str | None,
    pool_id: int | None = None,
) -> tuple[int, int | None]:
    """Create the run (reading `pool_id`, and with a policy version when an adapter is served); returns
    (run id, policy version id)."""
    run = create_run(session, name, kind, config=config, model=model, pool_id=pool_id)
    version = add_policy_version(session, run.id, 0, adapter_sha256) if adapter_sha256 else None
    return run.id, version


def _group(
    q: Question, mode: str, turns: list[Turn], step: int, run_id: int, policy_version_id: int | None
) -> NewGroup:
    assert q.problem_id is not None
    first = turns[0]
    return NewGroup(
        problem_id=q.problem_id,
        mode=STORED_MODE.get(mode, mode),
        prompt=first.prompt,
        prompt_version=first.prompt_version,
        prompt_tokens=first.prompt_tokens,
        step=step,
        run_id=run_id,
        policy_version_id=policy_version_id,
        attempts=[NewAttempt.of(t) for t in turns],
    )


def record_solutions(
    session: Session,
    solutions: Sequence[Solution],
    run_id: int,
    policy_version_id: int | None = None,
    retire: bool = True,
) -> list[int]:
    """Store every turn of `solutions` as attempts of `run_id`; returns the final-turn attempt ids.

    `retire`: let the writes retire lessons found harmful (`record_groups`; a server passes False). Turn 0 of a
    question's k samples shares one prompt: one group of k attempts. A later turn's prompt carries its
    own sample's earlier answer: one group per sample, whose context names the attempt it reflects on.
    """
    for s in solutions:
        if s.question.problem_id is None:
            raise InputError(
                f"question {s.question.external_id!r} is not in the store: import it first (import_questions)"
            )
    final: dict[tuple[int, int], int] = {}
    first_groups = []
    for s in solutions:
        group = _group(s.question, s.mode, [sample.turns[0] for sample in s.samples], 0, run_id, policy_version_id)
        group.contexts = [
            ContextRef(position=p, experience_version_id=e.experience_version_id, score=e.relevance)
            for p, e in enumerate(s.experiences)
        ]
        first_groups.append(group)
    for i, ids in enumerate(record_groups(session, first_groups, retire)):
        final.update({(i, j): attempt_id for j, attempt_id in enumerate(ids)})
    depth = max((len(sample.turns) for s in solutions for sample in s.samples), default=0)
    for step in range(1, depth):  # turn by turn: a later turn's context names the attempt of the turn before
        keys, later = [], []
        for i, s in enumerate(solutions):
            for j, sample in enumerate(s.samples):
                if step < len(sample.turns):
                    group = _group(s.question, s.mode, [sample.turns[step]], step, run_id, policy_version_id)
                    group.contexts = [ContextRef(position=0, context_attempt_id=final[(i, j)])]
                    keys.append((i, j))
                    later.append(group)
        for key, (attempt_id,) in zip(keys, record_groups(session, later, retire), strict=True):
            final[key] = attempt_id
    return [final[(i, j)] for i, s in enumerate(solutions) for j in range(len(s.samples))]
