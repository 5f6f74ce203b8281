"""`lanpo data import`: JSONL problems into the store, all or nothing.

Each line is an object `{"id", "question", "answer", ...}`; every other key goes into `metadata`.
`id` is a string or an integer (stored as text), `question` a non-empty string, `answer` a string or a
number (stored as text). Lines that break these rules (not valid JSON, missing key, wrong type, empty question,
NUL byte -- refused, Postgres text cannot hold it -- text over 1 MiB, an id already used earlier in the
file) are listed by line number and reason; the file imports nothing unless `skip_bad`. Re-importing the
same file changes nothing; a changed question/answer/metadata for an existing id is refused (listed like a
bad line) unless `update`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from lanpo.data.jsonl import parse_object, read_lines
from lanpo.db.repo import checks
from lanpo.db.repo.problems import Question, check_dataset_name, upsert_problems
from lanpo.errors import InputError, LanpoError
from lanpo.paths import input_file


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str


@dataclass
class ImportReport:
    lines: int = 0
    inserted: int = 0
    unchanged: int = 0
    updated: int = 0
    bad: list[BadLine] = field(default_factory=list)
    imported: bool = False  # False: nothing was written (bad lines without skip_bad)


def parse_line(text: str) -> Question:
    """One JSONL line -> Question; InputError with the reason when the line is bad."""
    obj = parse_object(text)
    missing = [k for k in ("id", "question", "answer") if k not in obj]
    if missing:
        raise InputError(f"missing key{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    raw_id, question, answer = obj.pop("id"), obj.pop("question"), obj.pop("answer")
    if isinstance(raw_id, bool) or not isinstance(raw_id, int | str):
        raise InputError(f"id must be a string or an integer, got {type(raw_id).__name__}")
    external_id = str(raw_id)
    if not external_id.strip():
        raise InputError("id is empty")
    if not isinstance(question, str):
        raise InputError(f"question must be a string, got {type(question).__name__}")
    if not question.strip():
        raise InputError("question is empty")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise InputError(f"answer must be a string or a number, got {type(answer).__name__}")
    answer = str(answer)
    for name, value in (("id", external_id), ("question", question), ("answer", answer)):
        if "\x00" in value:
            raise InputError(f"{name} contains a NUL byte (\\x00), which Postgres cannot store; refused")
        checks.check_size(value, name)
    try:
        metadata = checks.json_object(obj, "metadata")
    except InputError as exc:
        raise InputError(exc.message.replace("metadata contains", "metadata (extra keys) contains")) from exc
    return Question(external_id, question, answer, metadata)


def parse_lines(lines: Iterable[str]) -> tuple[list[tuple[int, Question]], list[BadLine]]:
    """All lines -> (good (line number, problem) pairs, bad lines). Blank lines are skipped; ids must be unique."""
    good: list[tuple[int, Question]] = []
    bad: list[BadLine] = []
    first_seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            problem = parse_line(text)
        except LanpoError as exc:
            bad.append(BadLine(number, exc.message))
            continue
        if problem.external_id in first_seen:
            bad.append(
                BadLine(
                    number, f"duplicate id {problem.external_id!r} (first on line {first_seen[problem.external_id]})"
                )
            )
            continue
        first_seen[problem.external_id] = number
        good.append((number, problem))
    return good, bad


def import_file(
    session: Session, path: str | Path, dataset: str, skip_bad: bool = False, update: bool = False
) -> ImportReport:
    """Import a JSONL file into `dataset` inside the caller's transaction (see the module docstring)."""
    check_dataset_name(dataset)
    path = input_file(path, "problem file")
    report = ImportReport()
    lines = read_lines(path, progress=True)
    report.lines = len(lines)
    good, report.bad = parse_lines(lines)
    if not good and not report.bad:
        raise InputError(f"{path} holds no problems", hint='one JSON object per line: {"id", "question", "answer"}')
    return store_problems(session, report, good, dataset, skip_bad, update)


def store_problems(
    session: Session,
    report: ImportReport,
    good: list[tuple[int, Question]],
    dataset: str,
    skip_bad: bool = False,
    update: bool = False,
) -> ImportReport:
    """Upsert the good (line, problem) pairs into `dataset` unless `report` holds bad lines and not `skip_bad`; all
    or nothing inside a savepoint (refused changes are listed as bad lines)."""
    check_dataset_name(dataset)
    if report.bad and not skip_bad:
        return report
    line_of = {p.external_id: n for n, p in good}
    savepoint = session.begin_nested()  # refused changes without skip_bad must leave nothing behind
    result = upsert_problems(session, dataset, [p for _, p in good], update=update)
    if result.refused and not skip_bad:
        savepoint.rollback()
    else:
        savepoint.commit()
    if result.refused:
        report.bad += [
            BadLine(line_of[e], f"id {e!r} already exists with different text; pass --update to overwrite it")
            for e in result.refused
        ]
        report.bad.sort(key=lambda b: b.line)
        if not skip_bad:
            return report
    report.inserted, report.unchanged, report.updated = result.inserted, result.unchanged, result.updated
    report.imported = True
    return report
