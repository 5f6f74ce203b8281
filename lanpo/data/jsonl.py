"""The one JSONL reader: problems (`lanpo data import`), a preset's JSONL, questions (`lanpo infer`), SFT pairs.

Lines split as a file iterates (on `\n`, `\r\n` or `\r`; never on the other characters `str.splitlines` cuts at,
which a JSON string may hold raw), blank lines are skipped, and every error names the file and the line:
`path:line: what is wrong`. A file that is not UTF-8 fails before any line is read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lanpo.errors import InputError
from lanpo.paths import input_file

UTF8_HINT = "JSONL files are UTF-8 text, one JSON object per line"


def read_text(path: Path) -> str:
    """The whole file as text; InputError when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text: {exc}", hint=UTF8_HINT) from exc


def read_lines(path: Path, progress: bool = False) -> list[str]:
    """Every line of the file (blank ones too, endings kept), split as a file iterates."""
    lines = io.StringIO(read_text(path), newline="")
    return list(
        tqdm(lines, desc=f"reading {path.name}", unit=" lines", disable=None if progress else True, leave=False)
    )


def parse_object(line: str) -> dict[str, Any]:
    """One line -> the JSON object it holds; InputError saying what is wrong (the caller adds file and line)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} at column {exc.colno}", hint="one JSON object per line") from exc
    if not isinstance(obj, dict):
        raise InputError(f"expected a JSON object, got {type(obj).__name__}", hint="one JSON object per line")
    return obj


def read_jsonl(path: str | Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of the JSONL file `path` (`what` names it in errors).

    The first bad line raises InputError `path:line: what is wrong`.
    """
    path = input_file(path, what)
    rows = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, parse_object(line)))
        except InputError as exc:
            raise InputError(f"{path}:{number}: {exc.message}", hint=exc.hint) from exc
    return rows
