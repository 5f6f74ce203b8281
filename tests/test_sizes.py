"""The size bounds of lanpo's code (STYLE.md): modules under 500 lines, functions under 80, and the GRPO step and
the update short enough to read as the method. Lines are counted from a `def` to its last line, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lanpo"
MODULE_LINES, FUNCTION_LINES = 500, 80
METHOD_LINES = {("lanpo/train/loop.py", "grpo_step"): 50, ("lanpo/train/consumer/update.py", "update_policy"): 60}


def _functions(path: Path) -> dict[str, int]:
    """Lines of every function in `path`, by qualified name (`Class.method`, `outer.inner`)."""
    lines: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, name + ".")

    walk(ast.parse(path.read_text(), str(path)), "")
    return lines


def test_no_function_over_80_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {name} {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, n in _functions(path).items()
        if n > FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


def test_no_module_over_500_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MODULE_LINES
    ]
    assert not long, "\n".join(long)


@pytest.mark.parametrize(("file", "function"), sorted(METHOD_LINES))
def test_the_step_and_the_update_read_as_the_method(file: str, function: str) -> None:
    n = _functions(ROOT / file)[function]
    assert n <= METHOD_LINES[file, function], f"{file}: {function} {n} lines (at most {METHOD_LINES[file, function]})"
