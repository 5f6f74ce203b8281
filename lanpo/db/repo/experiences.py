"""Experiences: add (version 1) to a pool under its capacity rules, or, where the pool merges, as a new version of the
active lesson a new one repeats (`lanpo.db.repo.merge`); append versions; read current or all versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models import EXPERIENCE_KINDS
from lanpo.db.repo import bulk, capacity, checks, merge
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import InputError
from lanpo.merging import keeps_new, same_text

EXPERIENCE_TYPES = ("int8", "int8", "int8", "int8", "text", "float8", "int8", "int4")
# a version's columns after (id, experience_id, version), as experience_versions_copy.sql lists them
VERSION_COLUMNS = (
    "summary",
    "embedding",
    "author",
    "policy_version_id",
    "prompt_version",
    "source_attempt_id",
    "reward",
    "run_id",
    "step",
)


@dataclass
class NewExperience:
    problem_id: int
    summary: str
    reward: float | None = None
    source_attempt_id: int | None = None
    kind: str = "summary"
    run_id: int | None = None
    step: int | None = None
    author: str | None = None
    policy_version_id: int | None = None
    prompt_version: str | None = None
    embedding: Any = None  # a sequence of floats of the store's dimension, or None


@dataclass
class AddResult:
    """`experience_ids` / `version_ids`: one per admitted item, in input order (dropped items are skipped): a new
    lesson and its version 1, or, for an item merged into the lesson it repeats, that lesson and its new version.

    `dropped`: input indices refused by the per-step cap; `merged`: those that became a new version of an active
    lesson; `duplicates`: those that repeated one and added nothing (the same text, or `merge_keeps` kept the
    current one); `evicted_ids`: experiences evicted by this call (may include ones it just inserted, e.g. a low
    reward under `lowest_reward`).
    """

    experience_ids: list[int] = field(default_factory=list)
    version_ids: list[int] = field(default_factory=list)
    evicted_ids: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    merged: list[int] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class VersionRow:
    id: int
    experience_id: int
    version: int
    summary: str
    author: str | None
    policy_version_id: int | None
    prompt_version: str | None
    created_at: datetime


def add_experiences(session: Session, pool: PoolRow, items: list[NewExperience], merge: bool = True) -> AddResult:
    """Insert experiences (with version 1) into `pool` and enforce its capacity policies in this transaction. When
    the pool merges (and `merge`), an item that repeats an active lesson of its problem becomes its new version."""
    if not items:
        return AddResult()
    rows = _checked_rows(session, items)
    kept, dropped = capacity.per_step_admit(
        [r["problem_id"] for r in rows], [r["reward"] for r in rows], pool.per_step_cap
    )
    capacity.lock_problems(session, pool, [r["problem_id"] for r in rows])
    if pool.merges and merge:
        result = _admit_merging(session, pool, rows, kept)
    else:
        result = AddResult(*_insert(session, pool, [rows[i] for i in kept]))
    evicted = capacity.enforce(session, pool, [r["problem_id"] for r in rows])
    _name_evicting_step(session, rows, evicted)
    result.evicted_ids, result.dropped = sorted(evicted), dropped
    return result


def _admit_merging(session: Session, pool: PoolRow, rows: list[dict[str, Any]], kept: list[int]) -> AddResult:
    """The kept rows one at a time, in input order (an item may repeat one admitted just before it): a new version
    of the active lesson it repeats (`merge.nearest`), nothing when that adds no text, else a new lesson."""
    out = AddResult()
    for index in kept:
        row = rows[index]
        if row["embedding"] is None:
            raise InputError(
                f"experience {index}: pool {pool.name!r} merges near-duplicates, and this lesson has no embedding",
                hint="embed new lessons first (lanpo.retrieval.embeddings.fill_embeddings), as the store client does",
            )
        near = merge.nearest(session, pool, row["problem_id"], row["kind"], row["summary"], row["embedding"])
        if near is None:
            experience_ids, version_ids = _insert(session, pool, [row])
            out.experience_ids += experience_ids
            out.version_ids += version_ids
        elif same_text(row["summary"], near.summary) or not keeps_new(pool.merge_keeps, row["reward"], near.reward):
            out.duplicates.append(index)
        else:
            version = _append(session, near.experience_id, row, f"merge:{pool.merge_keeps}", near.similarity)
            out.experience_ids.append(near.experience_id)
            out.version_ids.append(version)
            out.merged.append(index)
    return out


def _name_evicting_step(session: Session, rows: list[dict[str, Any]], evicted: list[int]) -> None:
    """Tie `evicted` to the training step whose insert evicted them (`evicted_run_id`, `evicted_step`), when every
    row comes from one (run, step): a resume that rolls that step back makes them active again."""
    steps = {(r["run_id"], r["step"]) for r in rows}
    if not evicted or len(steps) != 1:
        return
    ((run_id, step),) = steps
    if run_id is not None and step is not None:
        params = {"run_id": run_id, "step": step, "ids": evicted}
        session.execute(sqlfiles.load("queries/experiences_evicted_in"), params)


def add_evicted(session: Session, pool: PoolRow, items: list[NewExperience], evicted_by: str) -> AddResult:
    """Experiences that enter the history of `pool` but never its active part: inserted (with version 1) already
    evicted, `evicted_by` naming why (e.g. `mel:rejected`, a lesson that failed replay). No cap counts them."""
    if not items:
        return AddResult()
    if not evicted_by.strip() or ":" not in evicted_by:
        raise InputError(f"evicted_by must read '<scope>:<reason>', got {evicted_by!r}")
    experience_ids, version_ids = _insert(session, pool, _checked_rows(session, items))
    session.execute(
        sqlfiles.load("queries/experiences_mark_evicted"), {"ids": experience_ids, "evicted_by": evicted_by}
    )
    return AddResult(experience_ids=experience_ids, version_ids=version_ids, evicted_ids=list(experience_ids))


def _checked_rows(session: Session, items: list[NewExperience]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        where = f"experience {i}"
        if it.kind not in EXPERIENCE_KINDS:
            raise InputError(f"{where}: kind must be one of {', '.join(EXPERIENCE_KINDS)}, got {it.kind!r}")
        summary = checks.generated_text(it.summary, f"{where}: summary")
        if not summary or not summary.strip():
            raise InputError(f"{where}: summary is empty")
        rows.append(
            {
                "problem_id": checks.int_or_none(it.problem_id, f"{where}: problem_id"),
                "source_attempt_id": checks.int_or_none(it.source_attempt_id, f"{where}: source_attempt_id"),
                "kind": it.kind,
                "reward": checks.finite_or_none(it.reward, f"{where}: reward"),
                "run_id": checks.int_or_none(it.run_id, f"{where}: run_id"),
                "step": checks.int_or_none(it.step, f"{where}: step", minimum=0),
                "summary": summary,
                "author": checks.generated_text(it.author, f"{where}: author", True),
                "policy_version_id": checks.int_or_none(it.policy_version_id, f"{where}: policy_version_id"),
                "prompt_version": checks.generated_text(it.prompt_version, f"{where}: prompt_version", True),
                "embedding": checks.vector_text(session, it.embedding, "experience_versions", f"{where}: embedding"),
            }
        )
        if rows[-1]["problem_id"] is None:
            raise InputError(f"{where}: problem_id is required")
    return rows


def _insert(session: Session, pool: PoolRow, rows: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """COPY checked rows into `pool` as experiences with their version 1; returns (experience ids, version ids)."""
    experience_ids = bulk.reserve_ids(session, "experiences", len(rows))
    version_ids = bulk.reserve_ids(session, "experience_versions", len(rows))
    bulk.copy_rows(
        session,
        "queries/experiences_copy",
        (
            (eid, pool.id, r["problem_id"], r["source_attempt_id"], r["kind"], r["reward"], r["run_id"], r["step"])
            for eid, r in zip(experience_ids, rows, strict=True)
        ),
        EXPERIENCE_TYPES,
        "experiences",
    )
    bulk.copy_rows(
        session,
        "queries/experience_versions_copy",
        (
            (vid, eid, 1, *(r[name] for name in VERSION_COLUMNS))
            for vid, eid, r in zip(version_ids, experience_ids, rows, strict=True)
        ),
        None,
        "experience versions",
    )
    return experience_ids, version_ids


def append_version(
    session: Session,
    experience_id: int,
    summary: str,
    author: str | None = None,
    policy_version_id: int | None = None,
    prompt_version: str | None = None,
    embedding: Any = None,
) -> int:
    """A rewrite of an experience: a new version (max + 1, reason `rewrite`); returns its id. Evicted experiences
    may be rewritten."""
    summary = checks.generated_text(summary, "summary") or ""
    if not summary.strip():
        raise InputError("summary is empty")
    row = {
        "summary": summary,
        "embedding": checks.vector_text(session, embedding, "experience_versions", "embedding"),
        "author": author,
        "policy_version_id": policy_version_id,
        "prompt_version": prompt_version,
    }
    return _append(session, experience_id, row, "rewrite", None)


def _append(session: Session, experience_id: int, row: dict[str, Any], reason: str, similarity: float | None) -> int:
    """Append `row` (checked, as `_checked_rows` gives) as the experience's next version, with why; its id."""
    found = session.scalar(sqlfiles.load("queries/experience_lock"), {"experience_id": experience_id})
    if found is None:
        raise InputError(f"no experience with id {experience_id}")
    params = {name: row.get(name) for name in VERSION_COLUMNS}
    params |= {"experience_id": experience_id, "reason": reason, "similarity": similarity}
    return int(session.scalar(sqlfiles.load("queries/experience_version_append"), params))


def current_versions(session: Session, experience_ids: list[int]) -> dict[int, VersionRow]:
    """experience id -> its latest version (ids that do not exist are absent)."""
    rows = session.execute(
        sqlfiles.load("queries/experience_versions_current"), {"experience_ids": list(experience_ids)}
    )
    return {r.experience_id: VersionRow(*r) for r in rows}


def all_versions(session: Session, experience_id: int) -> list[VersionRow]:
    """Every version of an experience, oldest first; InputError when it does not exist."""
    rows = [
        VersionRow(*r)
        for r in session.execute(sqlfiles.load("queries/experience_versions_all"), {"experience_id": experience_id})
    ]
    if not rows:
        raise InputError(f"no experience with id {experience_id}")
    return rows
