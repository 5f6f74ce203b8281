"""Rollout groups and their attempts: one prompt (with the context injected into it) and the rollouts it produced.

A group is stored once: prompt text, template version, token count, run, step, problem, policy version, mode and
its context rows. Each attempt keeps only what differs between the rollouts of one prompt (the response, its
grade, and the adapter that served it), so a step of G prompts x n rollouts writes G prompts, not G * n.
Everything goes in with COPY after reserving ids, in the caller's transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session

from lanpo.db.models import ATTEMPT_MODES
from lanpo.db.repo import bulk, checks, usefulness
from lanpo.errors import InputError

GROUP_TYPES = ("int8", "int8", "int8", "int4", "int8", "text", "text", "text", "int4")
ATTEMPT_TYPES = ("int8", "int8", "text", "float8", "bool", "bool", "int4", "text")
CONTEXT_TYPES = ("int8", "int4", "int8", "int8", "float8")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ContextRef:
    """One item injected into a group's prompt: an experience version (inter) or an earlier attempt (intra)."""

    position: int
    experience_version_id: int | None = None
    context_attempt_id: int | None = None
    score: float | None = None


@dataclass
class NewAttempt:
    """One rollout of a group: the response, its grade, and the sha256 of the adapter that served it."""

    response: str
    reward: float | None = None
    correct: bool | None = None
    format_ok: bool | None = None
    completion_tokens: int | None = None
    served_adapter_sha256: str | None = None

    @classmethod
    def of(cls, rollout: GradedRollout) -> NewAttempt:
        """The attempt row of a graded rollout (a training rollout, a replay, an inference turn)."""
        return cls(
            response=rollout.response,
            reward=rollout.reward,
            correct=rollout.correct,
            format_ok=rollout.format_ok,
            completion_tokens=rollout.completion_tokens,
            served_adapter_sha256=rollout.served_adapter_sha256,
        )


class GradedRollout(Protocol):
    """What an attempt row is made of: a response, its grade, its length and the adapter that served it."""

    @property
    def response(self) -> str: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def correct(self) -> bool | None: ...
    @property
    def format_ok(self) -> bool | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def served_adapter_sha256(self) -> str | None: ...


@dataclass
class NewGroup:
    """One prompt and the rollouts generated from it."""

    problem_id: int
    mode: str
    prompt: str
    attempts: list[NewAttempt]
    prompt_version: str | None = None
    prompt_tokens: int | None = None
    step: int | None = None
    run_id: int | None = None
    policy_version_id: int | None = None
    contexts: list[ContextRef] = field(default_factory=list)


def _group_row(g: NewGroup, where: str) -> tuple:
    if g.mode not in ATTEMPT_MODES:
        raise InputError(f"{where}: mode must be one of {', '.join(ATTEMPT_MODES)}, got {g.mode!r}")
    problem_id = checks.int_or_none(g.problem_id, f"{where}: problem_id")
    if problem_id is None:
        raise InputError(f"{where}: problem_id is required")
    return (
        checks.int_or_none(g.run_id, f"{where}: run_id"),
        problem_id,
        checks.int_or_none(g.step, f"{where}: step", minimum=0),
        checks.int_or_none(g.policy_version_id, f"{where}: policy_version_id"),
        g.mode,
        checks.generated_text(g.prompt, f"{where}: prompt"),
        checks.generated_text(g.prompt_version, f"{where}: prompt_version", True),
        checks.int_or_none(g.prompt_tokens, f"{where}: prompt_tokens", minimum=0),
    )


def _attempt_row(a: NewAttempt, where: str) -> tuple:
    sha = a.served_adapter_sha256
    if sha is not None and (not isinstance(sha, str) or not _SHA256.fullmatch(sha)):
        raise InputError(f"{where}: served_adapter_sha256 must be 64 lowercase hex digits, got {sha!r}")
    return (
        checks.generated_text(a.response, f"{where}: response"),
        checks.finite_or_none(a.reward, f"{where}: reward"),
        checks.bool_or_none(a.correct, f"{where}: correct"),
        checks.bool_or_none(a.format_ok, f"{where}: format_ok"),
        checks.int_or_none(a.completion_tokens, f"{where}: completion_tokens", minimum=0),
        sha,
    )


def _context_rows(g: NewGroup, where: str) -> list[tuple]:
    rows, positions = [], set()
    for c in g.contexts:
        if (c.experience_version_id is None) == (c.context_attempt_id is None):
            raise InputError(f"{where}: a context names exactly one of experience_version_id, context_attempt_id")
        position = checks.int_or_none(c.position, f"{where}: context position", minimum=0)
        if position is None or position in positions:
            raise InputError(f"{where}: context positions must be distinct integers >= 0, got {c.position!r}")
        positions.add(position)
        rows.append(
            (
                position,
                checks.int_or_none(c.experience_version_id, f"{where}: experience_version_id"),
                checks.int_or_none(c.context_attempt_id, f"{where}: context_attempt_id"),
                checks.finite_or_none(c.score, f"{where}: context score"),
            )
        )
    return rows


def record_groups(session: Session, groups: list[NewGroup], retire: bool = True) -> list[list[int]]:
    """Insert `groups` with their attempts and contexts; returns each group's attempt ids, in input order.

    NUL bytes in prompt / response are stripped with a warning; text over 1 MiB, unknown modes, non-finite
    rewards, malformed hashes and contexts that name both or neither source raise InputError before anything
    is written. Keeps the `lesson_usefulness` of the versions used at the groups' keys current (`usefulness.refresh`)
    and, with `retire` (a server's writes pass False: its role may not evict), retires the lessons among them that
    their pool's `retire_below` finds harmful, tied to the groups' run and step when they share one.
    """
    group_rows, attempt_rows, context_rows = [], [], []
    for i, g in enumerate(groups):
        where = f"group {i}"
        group_rows.append(_group_row(g, where))
        if not g.attempts:
            raise InputError(f"{where}: a group holds at least one attempt")
        attempt_rows.extend((i, _attempt_row(a, f"{where} attempt {j}")) for j, a in enumerate(g.attempts))
        context_rows.extend((i, row) for row in _context_rows(g, where))
    if not groups:
        return []
    group_ids = bulk.reserve_ids(session, "rollout_groups", len(group_rows))
    attempt_ids = bulk.reserve_ids(session, "attempts", len(attempt_rows))
    bulk.copy_rows(
        session,
        "queries/rollout_groups_copy",
        ((gid, *row) for gid, row in zip(group_ids, group_rows, strict=True)),
        GROUP_TYPES,
        "rollout groups",
    )
    bulk.copy_rows(
        session,
        "queries/attempts_copy",
        ((aid, group_ids[i], *row) for aid, (i, row) in zip(attempt_ids, attempt_rows, strict=True)),
        ATTEMPT_TYPES,
        "attempts",
    )
    if context_rows:
        bulk.copy_rows(
            session,
            "queries/group_contexts_copy",
            ((group_ids[i], *row) for i, row in context_rows),
            CONTEXT_TYPES,
            "group contexts",
        )
    # a use, or a zero-shot baseline, changes lesson_usefulness at its key; any other group changes nothing there
    keys, versions, loose = set(), set(), []
    for g, row, group_id in zip(groups, group_rows, group_ids, strict=True):
        used = {c.experience_version_id for c in g.contexts if c.experience_version_id is not None}
        versions |= used
        if row[0] is None or row[2] is None:  # no run or no step: never a baseline, so only its own uses change
            loose += [group_id] if used else []
        elif g.mode == "zero_shot" or used:
            keys.add((row[0], row[2], row[1]))  # (run_id, step, problem_id)
    at = {(row[0], row[2]) for row in group_rows}  # (run_id, step)
    tied = usefulness.RetireAt(*next(iter(at))) if len(at) == 1 else usefulness.RetireAt()
    # The fit reads graded uses and graded baselines only: ungraded attempts (a server's answers, before feedback)
    # leave its input as it was, so their write refreshes the rows and skips the refit
    graded = any(a.correct is not None for g in groups for a in g.attempts)
    usefulness.refresh(session, keys, versions, loose, retire=tied if retire else None, fit=graded)
    out: list[list[int]] = [[] for _ in groups]
    for aid, (i, _) in zip(attempt_ids, attempt_rows, strict=True):
        out[i].append(aid)
    return out
