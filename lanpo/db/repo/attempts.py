"""Attempts (rollouts) and what was injected into their prompts, recorded in bulk in one statement."""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.models import ATTEMPT_MODES
from lanpo.db.repo import checks
from lanpo.errors import InputError


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
    """Insert `attempts` (and their contexts) in one round trip; returns their ids in input order.

    NUL bytes in prompt/response are stripped with a warning; text over 1 MiB, unknown modes, non-finite
    rewards and contexts that name both or neither source raise InputError before anything is written.
    """
    if not attempts:
        return []
    cols: dict[str, list] = {
        k: []
        for k in [
            "ords",
            "run_ids",
            "problem_ids",
            "steps",
            "policy_version_ids",
            "modes",
            "prompts",
            "responses",
            "prompt_versions",
            "rewards",
            "corrects",
            "format_oks",
            "prompt_tokens",
            "completion_tokens",
            "ctx_ords",
            "ctx_positions",
            "ctx_version_ids",
            "ctx_attempt_ids",
            "ctx_scores",
        ]
    }
    for i, a in enumerate(attempts, start=1):
        where = f"attempt {i - 1}"
        if a.mode not in ATTEMPT_MODES:
            raise InputError(f"{where}: mode must be one of {', '.join(ATTEMPT_MODES)}, got {a.mode!r}")
        cols["ords"].append(i)
        cols["run_ids"].append(checks.int_or_none(a.run_id, f"{where}: run_id"))
        cols["problem_ids"].append(checks.int_or_none(a.problem_id, f"{where}: problem_id"))
        cols["steps"].append(checks.int_or_none(a.step, f"{where}: step", minimum=0))
        cols["policy_version_ids"].append(checks.int_or_none(a.policy_version_id, f"{where}: policy_version_id"))
        cols["modes"].append(a.mode)
        cols["prompts"].append(checks.generated_text(a.prompt, f"{where}: prompt"))
        cols["responses"].append(checks.generated_text(a.response, f"{where}: response"))
        cols["prompt_versions"].append(checks.generated_text(a.prompt_version, f"{where}: prompt_version", True))
        cols["rewards"].append(checks.finite_or_none(a.reward, f"{where}: reward"))
        cols["corrects"].append(checks.bool_or_none(a.correct, f"{where}: correct"))
        cols["format_oks"].append(checks.bool_or_none(a.format_ok, f"{where}: format_ok"))
        cols["prompt_tokens"].append(checks.int_or_none(a.prompt_tokens, f"{where}: prompt_tokens", minimum=0))
        cols["completion_tokens"].append(
            checks.int_or_none(a.completion_tokens, f"{where}: completion_tokens", minimum=0)
        )
        positions = set()
        for c in a.contexts:
            if (c.experience_version_id is None) == (c.context_attempt_id is None):
                raise InputError(f"{where}: a context names exactly one of experience_version_id, context_attempt_id")
            if c.position in positions:
                raise InputError(f"{where}: two contexts at position {c.position}")
            positions.add(c.position)
            cols["ctx_ords"].append(i)
            cols["ctx_positions"].append(checks.int_or_none(c.position, f"{where}: context position", minimum=0))
            cols["ctx_version_ids"].append(c.experience_version_id)
            cols["ctx_attempt_ids"].append(c.context_attempt_id)
            cols["ctx_scores"].append(checks.finite_or_none(c.score, f"{where}: context score"))
    if None in cols["problem_ids"]:
        raise InputError("every attempt needs a problem_id")
    try:
        return list(session.scalars(sqlfiles.load("queries/attempts_insert"), cols))
    except sa.exc.IntegrityError as exc:
        raise foreign_key_error(exc, "attempts") from exc


def foreign_key_error(exc: sa.exc.IntegrityError, what: str) -> InputError:
    """A foreign-key violation as an InputError naming the missing row (the transaction is aborted)."""
    diag = getattr(exc.orig, "diag", None)
    detail = getattr(diag, "message_detail", None) or str(exc.orig).splitlines()[0]
    return InputError(
        f"cannot record {what}: {detail}",
        hint="refer only to problems, runs, attempts, policy and experience versions that exist",
    )
