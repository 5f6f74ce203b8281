"""The store side of `POST /v1/feedback`: find the served answer the caller may reach, grade it against a gold
answer when no verdict is given, and append the feedback. Its verdict's refit of the pool's lesson fit follows the
commit (`lanpo.serve.refit`)."""

from __future__ import annotations

from typing import Any

from lanpo.db.connection import transaction
from lanpo.db.repo.serving import record_feedback, served_answer
from lanpo.serve.api import FeedbackRequest
from lanpo.serve.http import ApiError, shown
from lanpo.serve.keys import Caller
from lanpo.serve.scopes import may_reach


def store_feedback(
    db: Any, caller: Caller, body: FeedbackRequest, pool_name: str | None, scope: str | None
) -> tuple[int, bool | None, Any]:
    """(the feedback's id, its verdict, the served answer's row), committed; a 404 for an answer that is not
    served, or not in the pool (scope) of the path, or in a pool or scope the key may not reach."""
    from lanpo.rewards import is_correct

    where = "" if pool_name is None else f" in pool {shown(pool_name)}"
    unknown = ApiError(
        404,
        f"no served answer {body.answer_id}{where} (or this key may not read its pool)",
        "answer_not_found",
        "answer_id",
    )
    with transaction(db) as session:
        row = served_answer(session, body.answer_id)
        if row is None or not caller.may_read(row.pool_name):
            raise unknown
        if pool_name is not None and row.pool_name != pool_name:  # the path names the pool it answers for
            raise unknown
        if not may_reach(caller, row.scope) or (scope is not None and row.scope != scope):
            raise unknown
        correct = None if body.verdict is None else body.verdict == "correct"
        if correct is None and body.gold_answer is not None:
            correct = bool(is_correct(row.response, body.gold_answer))
        fid = record_feedback(
            session,
            body.answer_id,
            reward=body.reward,
            correct=correct,
            gold_answer=body.gold_answer,
            key_name=caller.name,
            fit=False,  # refit after the commit, with other verdicts (lanpo.serve.refit)
        )
    return int(fid), correct, row
