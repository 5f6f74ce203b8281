"""Reading questions from JSONL and writing solutions back, with errors that name the file and line.

Input lines are objects `{"id"?, "question", "answer"?}` plus any other keys (kept as metadata). `id` may be a
string or an integer; without one, the id is the first 16 hex digits of the question's sha256, so the same
question always gets the same id. `answer` (the gold answer) is optional: `infer` grades only when it is there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lanpo.data.jsonl import read_jsonl
from lanpo.db.repo.problems import Question
from lanpo.errors import InputError
from lanpo.paths import atomic_write


def question_id(text: str) -> str:
    """The id of a question that came without one: stable across files and runs."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _scalar_text(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InputError(f"{where}: {key!r} must be a string or a number, got {type(value).__name__}")
    return str(value)


def parse_question(obj: Any, where: str) -> Question:
    """One decoded JSONL line -> Question; InputError naming `where` for anything malformed."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: 'question' must be a non-empty string", hint='each line: {"question": "..."}')
    raw_id = obj.get("id")
    qid = question_id(question) if raw_id is None else _scalar_text(raw_id, where, "id").strip()
    if not qid:
        raise InputError(f"{where}: 'id' is empty")
    answer = obj.get("answer")
    gold = None if answer is None else _scalar_text(answer, where, "answer")
    metadata = {k: v for k, v in obj.items() if k not in ("id", "question", "answer")}
    return Question(external_id=qid, question=question, answer=gold, metadata=metadata)


def read_questions(path: str | Path) -> list[Question]:
    """Questions from a JSONL file (blank lines skipped); duplicate ids and bad lines raise InputError."""
    questions: list[Question] = []
    seen: dict[str, int] = {}
    for number, obj in read_jsonl(path, "input file"):
        where = f"{path}:{number}"
        q = parse_question(obj, where)
        if q.external_id in seen:
            raise InputError(
                f"{where}: id {q.external_id!r} already used on line {seen[q.external_id]}", hint="ids must be unique"
            )
        seen[q.external_id] = number
        questions.append(q)
    if not questions:
        raise InputError(f"{path} holds no questions", hint='one JSON object per line: {"id", "question", "answer"?}')
    return questions


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as JSONL (parent folders created; all or nothing); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with atomic_write(path) as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
