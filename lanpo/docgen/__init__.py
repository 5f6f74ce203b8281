"""The generated docs pages: docs/cli.md from the click commands, docs/configuration.md from the config dataclasses.

`python -m lanpo.docgen` writes both; `python -m lanpo.docgen --check` writes nothing and fails when a committed
page differs from what the code makes now (tests/test_docs.py runs the same comparison).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

REGENERATE = "python -m lanpo.docgen"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def pages() -> dict[str, Callable[[], str]]:
    """Page file name -> the function that renders it."""
    from lanpo.docgen import cli, configuration

    return {"cli.md": cli.page, "configuration.md": configuration.page}


def stale(docs: Path = DOCS) -> list[str]:
    """The generated pages under `docs` that differ from what the code makes now (or are missing)."""
    out = []
    for name, render in pages().items():
        path = docs / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render():
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--check"]):
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    if args == ["--check"]:
        changed = stale()
        for name in changed:
            print(f"docs/{name} differs from the code: run `{REGENERATE}`", file=sys.stderr)
        return 1 if changed else 0
    for name, render in pages().items():
        (DOCS / name).write_text(render(), encoding="utf-8")
        print(f"wrote docs/{name}")
    return 0
