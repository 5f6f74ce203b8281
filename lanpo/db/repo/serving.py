"""What `lanpo serve` keeps besides its answers' attempts (migration 0014): one `served_answers` row per request, and
`answer_feedback` rows that a client posts later.

The server runs these as the serving role (`lanpo.db.serve_role`), which may insert them and read them, and change
nothing once written: feedback is appended, and `experience_usage` reads an attempt's latest verdict.

- `record_served(session, ServedAnswer(...))`: the request, in the transaction that records its attempts; a second
  row with the same `request_id` (the response's OpenAI id) is refused, so a request is never stored twice.
- `served_answer(session, attempt_id)`: the served answer that holds an attempt, with what feedback needs (the
  response to grade, the question, the run and its pool); None when the attempt is no served answer.
- `record_feedback(session, attempt_id, ...)`: a reward and/or a verdict, the gold answer it was graded against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo import checks, usefulness
from lanpo.db.repo.experiences import AddResult, NewExperience, add_experiences
from lanpo.db.repo.pools import PoolRow
from lanpo.errors import InputError


@dataclass
class ServedAnswer:
    """One request the server answered. `group_id`: the turn-0 rollout group (None: found from the first answer
    id, `turn0_group`); `answer_ids`: the final attempts, one per choice (`InferenceRun.record`'s ids)."""

    request_id: str
    run_id: int
    group_id: int | None
    answer_ids: list[int]
    mode: str
    fallback: str | None
    sampling: dict[str, Any]
    timings: dict[str, Any]  # e.g. {"queue_ms", "retrieval_ms", "generate_ms", "total_ms"}
    key_name: str | None
    streamed: bool
    scope: str | None = None  # the scope the request named (`lanpo.serve.scopes`)


@dataclass(frozen=True)
class FeedbackTarget:
    """A served attempt, as feedback needs it: what to grade, and the pool its caller's key must be allowed."""

    attempt_id: int
    response: str
    problem_id: int
    question: str
    served_id: int
    request_id: str
    run_id: int
    pool_id: int | None
    pool_name: str | None  # what an API key's pools name
    mode: str
    scope: str | None = None  # the scope the request named: a lesson learned from it belongs to that scope


def _name(value: Any, field: str, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{field} must be a non-empty string, got {value!r}")
    checks.refuse_nul(value, field)
    checks.check_size(value, field)
    return value


def turn0_group(session: Session, attempt_id: int) -> int | None:
    """The turn-0 rollout group of a final attempt (its own group unless self-correction revised it)."""
    return session.scalar(
        sqlfiles.load("queries/served_turn0_group"), {"attempt_id": checks.row_id(attempt_id, "attempt id")}
    )


def record_served(session: Session, answer: ServedAnswer) -> int:
    """Insert `answer`'s row (in the caller's transaction); its id. InputError before anything is written when a
    field is malformed, and when `request_id` is stored already (the transaction is then aborted: roll it back)."""
    request_id = _name(answer.request_id, "request id", allow_none=False)
    ids = [checks.row_id(i, "answer id") for i in answer.answer_ids]
    if not ids:
        raise InputError(f"served answer {request_id}: no answer ids (one final attempt per choice)")
    group_id = answer.group_id if answer.group_id is not None else turn0_group(session, ids[0])
    if group_id is None:
        raise InputError(f"served answer {request_id}: attempt {ids[0]} is not in the store")
    if not isinstance(answer.streamed, bool):
        raise InputError(f"streamed must be true or false, got {answer.streamed!r}")
    params = {
        "request_id": request_id,
        "run_id": checks.row_id(answer.run_id, "run id"),
        "group_id": checks.row_id(group_id, "group id"),
        "answer_ids": ids,
        "mode": _name(answer.mode, "mode", allow_none=False),
        "fallback": _name(answer.fallback, "fallback"),
        "sampling": json.dumps(checks.json_object(answer.sampling, "sampling")),
        "timings": json.dumps(checks.json_object(answer.timings, "timings")),
        "key_name": _name(answer.key_name, "key name"),
        "streamed": answer.streamed,
        "scope": _name(answer.scope, "scope"),
    }
    try:
        return int(session.scalar(sqlfiles.load("queries/served_answer_insert"), params))  # type: ignore[arg-type]
    except sa.exc.IntegrityError as exc:
        if "uq_served_answers_request_id" in str(exc.orig):
            raise InputError(f"request {request_id} is stored already: a request is never stored twice") from exc
        raise


def served_answer(session: Session, attempt_id: int) -> FeedbackTarget | None:
    """The served answer holding attempt `attempt_id`, with its response, question, run and pool; None when the
    attempt is not one a server answered (not in any `served_answers.answer_ids`), or does not exist."""
    attempt_id = checks.row_id(attempt_id, "answer id")
    row = session.execute(sqlfiles.load("queries/served_answer_of_attempt"), {"attempt_id": attempt_id}).one_or_none()
    if row is None:
        return None
    return FeedbackTarget(
        int(row.attempt_id),
        row.response,
        int(row.problem_id),
        row.question,
        int(row.served_id),
        row.request_id,
        int(row.run_id),
        None if row.pool_id is None else int(row.pool_id),
        row.pool_name,
        row.mode,
        row.scope,
    )


def record_feedback(
    session: Session,
    attempt_id: int,
    *,
    reward: float | None,
    correct: bool | None,
    gold_answer: str | None,
    key_name: str | None,
    fit: bool = True,
) -> int:
    """Append feedback on attempt `attempt_id` (in the caller's transaction); its id. A reward (finite) or a
    verdict is required; InputError, with nothing written, otherwise. The caller checks the attempt is a served
    answer (`served_answer`) and that the key may reach its pool. A verdict refreshes the `lesson_usefulness` of the
    versions used at the attempt's key (`usefulness.refresh_at_attempt`), and with `fit` refits their pool here;
    `lanpo serve` passes False and refits after the commit (`lanpo.serve.refit`). A reward alone changes none."""
    reward = checks.finite_or_none(reward, "reward")
    correct = checks.bool_or_none(correct, "verdict")
    if reward is None and correct is None:
        raise InputError("feedback needs a reward or a verdict", hint='send "reward": 1.0 or "verdict": "correct"')
    if gold_answer is not None:
        if not isinstance(gold_answer, str):
            raise InputError(f"gold answer must be a string, got {type(gold_answer).__name__}")
        checks.refuse_nul(gold_answer, "gold answer")
        checks.check_size(gold_answer, "gold answer")
    params = {
        "attempt_id": checks.row_id(attempt_id, "answer id"),
        "reward": reward,
        "correct": correct,
        "gold_answer": gold_answer,
        "key_name": _name(key_name, "key name"),
    }
    feedback_id = int(session.scalar(sqlfiles.load("queries/answer_feedback_insert"), params))  # type: ignore[arg-type]
    if correct is not None:
        usefulness.refresh_at_attempt(session, params["attempt_id"], fit=fit)
    return feedback_id


def learned_from(session: Session, attempt_id: int) -> int | None:
    """The experience already learned from served attempt `attempt_id` (one per answer), or None."""
    found = session.scalar(
        sqlfiles.load("queries/served_lesson_of_attempt"), {"attempt_id": checks.row_id(attempt_id, "answer id")}
    )
    return None if found is None else int(found)


def add_served_lesson(
    session: Session, pool: PoolRow, lesson: NewExperience, scope: str | None, feedback_id: int
) -> AddResult:
    """Admit a lesson learned from feedback `feedback_id` to `pool` under its caps (`add_experiences`: the per-step
    cap, then the pool's capacity policies, in this transaction), with its scope and provenance. It is never merged
    into another lesson, as a merge would fold one request's words into a lesson other scopes read."""
    result = add_experiences(session, pool, [lesson], merge=False)
    if result.experience_ids:
        session.execute(
            sqlfiles.load("queries/served_lesson_provenance"),
            {
                "ids": result.experience_ids,
                "scope": _name(scope, "scope"),
                "feedback_id": checks.row_id(feedback_id, "feedback id"),
            },
        )
    return result


def lock_served_attempt(session: Session, attempt_id: int) -> None:
    """Hold attempt `attempt_id`'s row until this transaction ends (one lesson per answer, `lanpo.serve.learn`)."""
    session.execute(
        sqlfiles.load("queries/served_attempt_lock"), {"attempt_id": checks.row_id(attempt_id, "answer id")}
    )
