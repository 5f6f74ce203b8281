"""Attempts (rollouts) and what was injected into their prompts, recorded in bulk in one statement."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from lanpo.db.models import ATTEMPT_MODES
from lanpo.db.repo import bulk, checks
from lanpo.errors import InputError

ATTEMPT_TYPES = (
    "int8",
    "int8",
    "int8",
    "int4",
    "int8",
    "text",
    "text",
    "text",
    "text",
    "float8",
    "bool",
    "bool",
    "int4",
    "int4",
)
CONTEXT_TYPES = ("int8", "int4", "int8", "int8", "float8")


@dataclass(frozen=True)
class ContextRef:
    """One item injected into an attempt's prompt: an experience version (inter) or an earlier attempt (intra)."""

    position: int
    experience_version_id: int | None = None
    context_attempt_id: int | None = None
    score: float | None = None


@dataclass
class NewAttempt:
    problem_id: int
    mode: str
    prompt: str
    response: str
    reward: float | None = None
    correct: bool | None = None
    format_ok: bool | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    step: int | None = None
    run_id: int | None = None
    policy_version_id: int | None = None
    prompt_version: str | None = None
    contexts: list[ContextRef] = field(default_factory=list)


def record_attempts(session: Session, attempts: list[NewAttempt]) -> list[int]:
    """Insert `attempts` and their contexts (reserve ids + two COPYs); returns their ids in input order.

    NUL bytes in prompt/response are stripped with a warning; text over 1 MiB, unknown modes, non-finite
    rewards and contexts that name both or neither source raise InputError before anything is written.
    """
    if not attempts:
        return []
    rows: list[tuple] = []
    contexts: list[tuple[int, int, int | None, int | None, float | None]] = []
    for i, a in enumerate(attempts):
        where = f"attempt {i}"
        if a.mode not in ATTEMPT_MODES:
            raise InputError(f"{where}: mode must be one of {', '.join(ATTEMPT_MODES)}, got {a.mode!r}")
        problem_id = checks.int_or_none(a.problem_id, f"{where}: problem_id")
        if problem_id is None:
            raise InputError(f"{where}: problem_id is required")
        rows.append(
            (
                checks.int_or_none(a.run_id, f"{where}: run_id"),
                problem_id,
                checks.int_or_none(a.step, f"{where}: step", minimum=0),
                checks.int_or_none(a.policy_version_id, f"{where}: policy_version_id"),
                a.mode,
                checks.generated_text(a.prompt, f"{where}: prompt"),
                checks.generated_text(a.response, f"{where}: response"),
                checks.generated_text(a.prompt_version, f"{where}: prompt_version", True),
                checks.finite_or_none(a.reward, f"{where}: reward"),
                checks.bool_or_none(a.correct, f"{where}: correct"),
                checks.bool_or_none(a.format_ok, f"{where}: format_ok"),
                checks.int_or_none(a.prompt_tokens, f"{where}: prompt_tokens", minimum=0),
                checks.int_or_none(a.completion_tokens, f"{where}: completion_tokens", minimum=0),
            )
        )
        positions: set[int] = set()
        for c in a.contexts:
            if (c.experience_version_id is None) == (c.context_attempt_id is None):
                raise InputError(f"{where}: a context names exactly one of experience_version_id, context_attempt_id")
            position = checks.int_or_none(c.position, f"{where}: context position", minimum=0)
            if position is None or position in positions:
                raise InputError(f"{where}: context positions must be distinct integers >= 0, got {c.position!r}")
            positions.add(position)
            contexts.append(
                (
                    i,
                    position,
                    checks.int_or_none(c.experience_version_id, f"{where}: experience_version_id"),
                    checks.int_or_none(c.context_attempt_id, f"{where}: context_attempt_id"),
                    checks.finite_or_none(c.score, f"{where}: context score"),
                )
            )
    ids = bulk.reserve_ids(session, "attempts", len(rows))
    bulk.copy_rows(
        session, "queries/attempts_copy", ((ids[i], *row) for i, row in enumerate(rows)), ATTEMPT_TYPES, "attempts"
    )
    if contexts:
        bulk.copy_rows(
            session,
            "queries/attempt_contexts_copy",
            ((ids[i], *rest) for i, *rest in contexts),
            CONTEXT_TYPES,
            "attempt contexts",
        )
    return ids
