"""Problems: idempotent bulk upsert, lookup by dataset + external id or by id, and CLI id parsing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles, stats
from lanpo.db.repo import checks
from lanpo.errors import InputError, listing


@dataclass(frozen=True)
class Question:
    """One problem, to import or to solve: its external id (unique within its dataset), the question, the gold
    answer when known (never shown to the model), metadata, and its `problems.id` once it is in the store (an
    import ignores it)."""

    external_id: str
    question: str
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    problem_id: int | None = None


@dataclass(frozen=True)
class ProblemRow:
    id: int
    dataset: str
    external_id: str
    question: str
    answer: str | None
    metadata: dict[str, Any]


@dataclass
class ImportResult:
    """What an upsert did. `refused`: external ids whose stored text differs (not overwritten without update)."""

    inserted: int = 0
    unchanged: int = 0
    updated: int = 0
    refused: list[str] = field(default_factory=list)


def _check(dataset: str, row: Question) -> None:
    where = f"problem {dataset}:{row.external_id}"
    if not isinstance(row.external_id, str) or not row.external_id.strip():
        raise InputError(f"{where}: external_id must be a non-empty string")
    if not isinstance(row.question, str) or not row.question.strip():
        raise InputError(f"{where}: question must be a non-empty string")
    if row.answer is not None and not isinstance(row.answer, str):
        raise InputError(f"{where}: answer must be a string or None, got {type(row.answer).__name__}")
    for name, text in (("external_id", row.external_id), ("question", row.question), ("answer", row.answer)):
        if text is not None:
            checks.refuse_nul(text, f"{where}: {name}")
            checks.check_size(text, f"{where}: {name}")
    checks.json_object(row.metadata, f"{where}: metadata")


def check_dataset_name(dataset: str) -> None:
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError("dataset name must be a non-empty string", hint="name it, e.g. --dataset chain_sum")
    checks.refuse_nul(dataset, "dataset name")
    if ":" in dataset:
        raise InputError(
            f"dataset name {dataset!r} must not contain ':' (used in dataset:external_id references)",
            hint=f"e.g. {dataset.replace(':', '-')!r}",
        )


def upsert_problems(session: Session, dataset: str, rows: list[Question], update: bool = False) -> ImportResult:
    """Insert new problems; identical ones are unchanged; changed ones are updated only when `update`.

    Without `update`, changed rows are reported in `refused` and left as stored (the caller decides whether
    that aborts its transaction). Duplicate external ids within `rows` are refused with InputError. Writers of one
    dataset take turns (an advisory lock to the end of the transaction), so two processes generating it at once
    both succeed, the second finding the first's rows unchanged.
    """
    check_dataset_name(dataset)
    seen: set[str] = set()
    for row in rows:
        _check(dataset, row)
        if row.external_id in seen:
            raise InputError(f"problem id {row.external_id!r} appears twice in one import")
        seen.add(row.external_id)
    result = ImportResult()
    if not rows:
        return result
    session.execute(sqlfiles.load("queries/lock_dataset"), {"dataset": dataset})  # concurrent writers take turns
    existing = {
        r.external_id: (r.question, r.answer, r.metadata)
        for r in session.execute(
            sqlfiles.load("queries/problems_existing"),
            {"dataset": dataset, "external_ids": [r.external_id for r in rows]},
        )
    }
    new, changed = [], []
    for row in rows:
        old = existing.get(row.external_id)
        if old is None:
            new.append(row)
        elif old == (row.question, row.answer, row.metadata):
            result.unchanged += 1
        elif update:
            changed.append(row)
        else:
            result.refused.append(row.external_id)
    for statement, batch in (("queries/problems_insert", new), ("queries/problems_update", changed)):
        if batch:
            stats.note_write(session, "problems", rows=len(batch) if batch is new else 0)
            session.execute(
                sqlfiles.load(statement),
                {
                    "dataset": dataset,
                    "external_ids": [r.external_id for r in batch],
                    "questions": [r.question for r in batch],
                    "answers": [r.answer for r in batch],
                    "metadatas": [json.dumps(r.metadata) for r in batch],
                },
            )
    result.inserted, result.updated = len(new), len(changed)
    return result


def _row(r: Any) -> ProblemRow:
    return ProblemRow(r.id, r.dataset, r.external_id, r.question, r.answer, r.metadata)


def known_datasets(session: Session) -> list[str]:
    return list(session.scalars(sqlfiles.load("queries/datasets")))


def _unknown_dataset(session: Session, dataset: str) -> InputError:
    known = known_datasets(session)
    return InputError(
        f"unknown dataset {dataset!r}",
        hint=f"datasets in the store: {listing(known)}"
        if known
        else "import one: lanpo data import FILE --dataset NAME",
    )


def get_problem(session: Session, dataset: str, external_id: str) -> ProblemRow:
    """The problem `dataset:external_id`; InputError naming what is unknown."""
    checks.refuse_nul(f"{dataset}:{external_id}", "problem reference")
    r = session.execute(
        sqlfiles.load("queries/problem_by_external_id"), {"dataset": dataset, "external_id": str(external_id)}
    ).one_or_none()
    if r is None:
        if dataset not in known_datasets(session):
            raise _unknown_dataset(session, dataset)
        raise InputError(f"no problem {external_id!r} in dataset {dataset!r}", hint="check the id (lanpo sql ...)")
    return _row(r)


ID_HINT = "problem ids are the numeric `problems.id`, or `dataset:external_id` on the command line"


def problems_by_ids(session: Session, ids: list[int]) -> list[ProblemRow]:
    """Problems by numeric id, in the order given; InputError listing ids that do not exist."""
    for i in ids:
        checks.row_id(i, "problem id", hint=ID_HINT)
    rows = {r.id: _row(r) for r in session.execute(sqlfiles.load("queries/problems_by_ids"), {"ids": list(ids)})}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise InputError(
            f"unknown problem id{'s' if len(missing) > 1 else ''}: {', '.join(map(str, missing[:20]))}",
            hint=ID_HINT,
        )
    return [rows[i] for i in ids]


def require_dataset(session: Session, dataset: str) -> None:
    """InputError listing the datasets in the store unless `dataset` has problems."""
    if dataset not in known_datasets(session):
        raise _unknown_dataset(session, dataset)


def problems_of_dataset(session: Session, dataset: str) -> list[ProblemRow]:
    """Every problem of `dataset`, by id ([] when it has none)."""
    return [_row(r) for r in session.execute(sqlfiles.load("queries/problems_of_dataset"), {"dataset": dataset})]


def problem_ids(session: Session, dataset: str) -> list[int]:
    """Every problem id of `dataset`, ascending; InputError when the dataset has none."""
    ids = list(session.scalars(sqlfiles.load("queries/problem_ids_of_dataset"), {"dataset": dataset}))
    if not ids:
        raise _unknown_dataset(session, dataset)
    return ids


def resolve_refs(session: Session, refs: list[str]) -> list[int]:
    """CLI references -> problem ids: a number is `problems.id`, `dataset:external_id` is looked up."""
    out: list[int] = []
    for ref in refs:
        ref = ref.strip()
        if re.fullmatch(r"[+-]?[0-9]+", ref):
            out.append(checks.row_id(int(ref), "problem id", hint=ID_HINT))
        elif ":" in ref:
            dataset, external_id = ref.split(":", 1)
            out.append(get_problem(session, dataset, external_id).id)
        else:
            raise InputError(
                f"problem reference {ref!r} is neither a numeric id nor dataset:external_id", hint=ID_HINT
            )
    problems_by_ids(session, [i for i in out])
    return out
