"""`lanpo data import`: idempotent, all-or-nothing on bad lines, --skip-bad, --update, every bad-line reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.data.importer import parse_lines


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _count(db: Engine, dataset: str = "ds") -> int:
    with db.connect() as conn:
        return conn.scalar(sa.text("SELECT count(*) FROM problems WHERE dataset = :d"), {"d": dataset})


GOOD = [
    json.dumps({"id": 1, "question": "1+1?", "answer": "2", "task": "add"}),
    json.dumps({"id": "b", "question": "2+2?", "answer": 4}),
]


def test_import_is_idempotent(tmp_path: Path, run_cli: Callable, db: Engine) -> None:
    f = _write(tmp_path / "p.jsonl", GOOD)
    first = run_cli("data", "import", f, "--dataset", "ds")
    assert first.code == 0, first.err
    assert "2 inserted, 0 unchanged" in first.out
    again = run_cli("data", "import", f, "--dataset", "ds")
    assert "0 inserted, 2 unchanged" in again.out
    assert _count(db) == 2
    with db.connect() as conn:
        row = conn.execute(sa.text("SELECT answer, metadata FROM problems WHERE external_id = '1'")).one()
    assert row.answer == "2" and row.metadata == {"task": "add"}


def test_changed_text_refused_unless_update(tmp_path: Path, run_cli: Callable, db: Engine) -> None:
    run_cli("data", "import", _write(tmp_path / "a.jsonl", GOOD), "--dataset", "ds")
    changed = [
        json.dumps({"id": 1, "question": "1+1=?", "answer": "2", "task": "add"}),
        GOOD[1],
        json.dumps({"id": "new", "question": "3+3?", "answer": "6"}),
    ]
    f = _write(tmp_path / "b.jsonl", changed)
    refused = run_cli("data", "import", f, "--dataset", "ds")
    assert refused.code == 2
    assert "b.jsonl:1: id '1' already exists with different text; pass --update" in refused.err
    assert "nothing was imported" in refused.err and _count(db) == 2  # 'new' was not inserted either
    updated = run_cli("data", "import", f, "--dataset", "ds", "--update")
    assert updated.code == 0 and "1 inserted, 1 unchanged, 1 updated" in updated.out
    with db.connect() as conn:
        assert conn.scalar(sa.text("SELECT question FROM problems WHERE external_id = '1'")) == "1+1=?"


BAD = [
    ("{not json", "not valid JSON"),
    ('["a", "list"]', "expected a JSON object, got list"),
    ('{"id": 5, "answer": "1"}', "missing key: question"),
    ('{"question": "q"}', "missing keys: id, answer"),
    ('{"id": 1.5, "question": "q", "answer": "1"}', "id must be a string or an integer, got float"),
    ('{"id": true, "question": "q", "answer": "1"}', "id must be a string or an integer, got bool"),
    ('{"id": 6, "question": 7, "answer": "1"}', "question must be a string, got int"),
    ('{"id": 7, "question": "   ", "answer": "1"}', "question is empty"),
    ('{"id": 8, "question": "q", "answer": ["1"]}', "answer must be a string or a number, got list"),
    ('{"id": 9, "question": "a\\u0000b", "answer": "1"}', "question contains a NUL byte"),
    ('{"id": 10, "question": "q", "answer": "1", "note": "x\\u0000"}', "metadata (extra keys) contains a NUL byte"),
    ('{"id": "", "question": "q", "answer": "1"}', "id is empty"),
    ('{"id": 1, "question": "dup", "answer": "1"}', "duplicate id '1' (first on line 1)"),
]


def test_bad_lines_import_nothing_and_are_listed(tmp_path: Path, run_cli: Callable, db: Engine) -> None:
    lines = [GOOD[0], *(text for text, _ in BAD), GOOD[1]]
    f = _write(tmp_path / "bad.jsonl", lines)
    result = run_cli("data", "import", f, "--dataset", "ds")
    assert result.code == 2
    for number, (_, reason) in enumerate(BAD, start=2):
        assert f"bad.jsonl:{number}: {reason}" in result.err, reason
    assert f"{len(BAD)} bad lines" in result.err and "nothing was imported" in result.err
    assert _count(db) == 0
    skipped = run_cli("data", "import", f, "--dataset", "ds", "--skip-bad")
    assert skipped.code == 0 and f"2 inserted, 0 unchanged, 0 updated, {len(BAD)} bad line(s) skipped" in skipped.out
    assert "bad.jsonl:2: not valid JSON" in skipped.err
    assert _count(db) == 2


def test_long_text_refused() -> None:
    good, bad = parse_lines([json.dumps({"id": 1, "question": "x" * 1_100_000, "answer": "1"})])
    assert good == [] and "limit is 1,048,576 bytes" in bad[0].reason


def test_unknown_and_bad_inputs(tmp_path: Path, run_cli: Callable) -> None:
    missing = run_cli("data", "import", tmp_path / "none.jsonl", "--dataset", "ds")
    assert missing.code == 2 and "does not exist" in missing.err
    f = _write(tmp_path / "p.jsonl", GOOD)
    colon = run_cli("data", "import", f, "--dataset", "a:b")
    assert colon.code == 2 and "must not contain ':'" in colon.err
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": 1, "question": "caf\xe9", "answer": "1"}\n')
    latin = run_cli("data", "import", tmp_path / "latin1.jsonl", "--dataset", "ds")
    assert latin.code == 2 and "not UTF-8" in latin.err
    stats = run_cli("pool", "stats", "--dataset", "nope")
    assert stats.code == 2 and "unknown dataset 'nope'" in stats.err
