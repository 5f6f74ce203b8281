"""Every hint lanpo can print is one line under HINT_LIMIT characters (issue 38): read from the source, then driven.

The static half reads every hint lanpo makes, wherever it makes one: a `hint=` argument, the second argument of an
error class (the third of `lanpo.config.check`) and an assignment to `.hint`. Each is sized by `HintSize`: literal
text as written, a module constant by its value, `listing(...)` by the room it is given, and any other value (a
name, a number, a path the user gave) as PLACEHOLDER characters. A `", ".join(...)` of anything but a constant
grows with what it joins and is refused: lists go through `lanpo.errors.listing`. A parameter or an exception's
hint passed on is checked where it is made. The text an administrator copies (SQL) is `detail`, not hint.

The dynamic half drives the CLI's error paths against the test database: the sweep in tests/test_cli_errors.py
(every command and option; its `assert_clean_error` holds the bound too), and here the ones whose hint grows with
the store or with the migrations: an unknown revision, and unknown names among many pools and datasets.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db import migrate
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import HINT_LIMIT, LanpoError, listing

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = 24  # characters a value formatted into a hint is taken to have (a name, a number, a short path)
ERROR_CLASSES = {"LanpoError", "ConfigError", "InputError", "DatabaseUnavailable", "NotMigrated", "ReaderUnavailable"}
# Subclasses defined outside lanpo/errors.py take (message, hint) too.
ERROR_CLASSES |= {
    node.name
    for path in (ROOT / "lanpo").rglob("*.py")
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) in ERROR_CLASSES for b in node.bases)
}


class Unsized(Exception):
    """A hint expression whose length grows with its input (a join over a collection the store fills)."""


OPTIONAL_IMPORTS = ("verl", "transfer_queue", "ray", "tensordict")  # installed in the verl lane only (docs/verl.md)


class HintSize:
    """The longest a hint expression can print, and whether it can print a newline, read from one module's AST."""

    def __init__(self, module: str, scope: ast.AST | None) -> None:
        try:
            self.module: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # lanpo.integrations.verl's verl-side modules: verl is the verl lane's
            if not (exc.name or "").startswith(OPTIONAL_IMPORTS):
                raise
            self.module = None  # its hints are still sized from their text; a module constant in one is not
        self.scope = scope  # the function the hint is made in: its local names are sized by what they are bound to

    def size(self, node: ast.expr) -> tuple[int, bool]:
        """(length, multi-line) of what `node` can print."""
        if isinstance(node, ast.Constant):
            text = "" if node.value is None else str(node.value)
            return len(text), "\n" in text
        if isinstance(node, ast.JoinedStr):
            parts = [self.size(v) for v in node.values]
            return sum(n for n, _ in parts), any(m for _, m in parts)
        if isinstance(node, ast.FormattedValue):
            inner = node.value
            return self.size(inner) if isinstance(inner, ast.IfExp | ast.BinOp | ast.BoolOp) else self.value(inner)
        if isinstance(node, ast.IfExp):
            (a, ma), (b, mb) = self.size(node.body), self.size(node.orelse)
            return max(a, b), ma or mb
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            (a, ma), (b, mb) = self.size(node.left), self.size(node.right)
            return a + b, ma or mb
        if isinstance(node, ast.BoolOp):  # `exc.hint or f"..."`: the longest of its operands
            sizes = [self.size(v) for v in node.values]
            return max(n for n, _ in sizes), any(m for _, m in sizes)
        return self.value(node)

    def value(self, node: ast.expr) -> tuple[int, bool]:
        """A formatted value: a constant's text, a listing's room, a join refused, anything else a placeholder."""
        constant = self.constant(node)
        if constant is not None:
            return len(constant), "\n" in constant
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "listing":
            room = next((self.constant(a) for a in node.args[1:2]), None)
            every = next((k.value for k in node.keywords if k.arg == "every"), None)
            extra = self.size(every)[0] + 4 if every is not None else 0
            return int(room or 100) + len(" and 9999 more") + extra, False
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
            joined = node.args[0] if node.args else None
            if joined is not None and self.constant(joined) is not None:
                return len(str(self.constant(node))), False
            sep = self.constant(node.func.value) if isinstance(node.func, ast.Attribute) else None
            if sep == ".":  # a dotted config key: a path of names, not a list
                return PLACEHOLDER, False
            raise Unsized(ast.unparse(node))
        if isinstance(node, ast.Name) and self.scope is not None:
            bound = [
                n.value
                for n in ast.walk(self.scope)
                if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == node.id for t in n.targets)
            ]
            if bound:
                sizes = [self.size(v) for v in bound]
                return max(n for n, _ in sizes), any(m for _, m in sizes)
        return PLACEHOLDER, False

    def constant(self, node: ast.expr) -> Any:
        """The value of a module-level constant (UPPER_CASE, possibly through a module attribute), else None."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join" and node.args:
            items, sep = self.constant(node.args[0]), self.constant(node.func.value)  # type: ignore[attr-defined]
            return None if items is None or sep is None else sep.join(map(str, items))
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or not (names or [node.id])[0].isupper():
            return None
        value: Any = self.module
        for name in [node.id, *reversed(names)]:
            value = getattr(value, name, None)
        return value if isinstance(value, str | int | tuple | list | dict) else None


def hint_sites() -> Iterator[tuple[str, int, ast.expr, HintSize]]:
    """(file, line, hint expression, its sizer) for every hint made in lanpo/."""
    for path in sorted((ROOT / "lanpo").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for node in ast.walk(tree):
            hints: list[ast.expr] = []
            if isinstance(node, ast.Call):
                hints += [k.value for k in node.keywords if k.arg == "hint"]
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                position = 2 if name == "check" else 1 if name in ERROR_CLASSES else None
                if position is not None and len(node.args) > position:
                    hints.append(node.args[position])
            elif isinstance(node, ast.Assign) and any(getattr(t, "attr", None) == "hint" for t in node.targets):
                hints.append(node.value)
            for hint in hints:
                yield str(path.relative_to(ROOT)), hint.lineno, hint, HintSize(module, innermost(functions, node))


def innermost(functions: list[ast.FunctionDef | ast.AsyncFunctionDef], node: ast.AST) -> ast.AST | None:
    """The innermost function `node` is in, or None at module level."""
    inside = [f for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]  # type: ignore[attr-defined]
    return min(inside, key=lambda f: (f.end_lineno or 0) - f.lineno, default=None)


def passed_on(hint: ast.expr, sizer: HintSize) -> bool:
    """A parameter (sized where the caller makes it) or another exception's hint (`exc.hint`, Postgres's own)."""
    if isinstance(hint, ast.Name) and isinstance(sizer.scope, ast.FunctionDef | ast.AsyncFunctionDef):
        args = sizer.scope.args
        if hint.id in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}:
            return True
    root = hint
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in ("exc", "error", "err") and hint is not root


SITES = list(hint_sites())
# Joins the sizer cannot bound, each bounded by the code that declares what they join (function: why).
DECLARED_JOINS = {
    "translate": "the values a `Renamed` config key declares in lanpo.config (two or three)",
}


def test_the_static_walk_finds_the_hints() -> None:
    """The walk sees every way a hint is made (a walk that found none would pass everything)."""
    files = {file for file, *_ in SITES}
    assert len(SITES) > 200 and len(files) > 40
    assert any(file == "lanpo/db/migrate.py" for file in files)
    assert any(file == "lanpo/config.py" for file in files)  # `check(cond, message, hint)` and `exc.hint = ...`


def test_every_hint_in_the_source_is_one_short_line() -> None:
    too_long, unsized = [], []
    for file, line, hint, sizer in SITES:
        if passed_on(hint, sizer):
            continue
        try:
            length, multiline = sizer.size(hint)
        except Unsized as exc:
            if getattr(sizer.scope, "name", None) in DECLARED_JOINS:
                continue
            unsized.append(f"{file}:{line}: joins {exc} (use lanpo.errors.listing)")
            continue
        if length >= HINT_LIMIT or multiline:
            too_long.append(f"{file}:{line}: up to {length} characters{', several lines' if multiline else ''}")
    assert not unsized, "\n".join(unsized)
    assert not too_long, "\n".join(too_long)


def test_the_sizer_catches_what_it_must() -> None:
    """A list joined into a hint, a long constant and a newline fail; listing and placeholders are sized."""
    sizer = HintSize("lanpo.db.migrate", None)

    def size(source: str) -> tuple[int, bool]:
        return sizer.size(ast.parse(source, mode="eval").body)

    with pytest.raises(Unsized):
        size("f\"revisions: {', '.join(known)}\"")
    assert size("'x' * 3") == (PLACEHOLDER, False)
    assert size(f"'{'a' * HINT_LIMIT}'")[0] == HINT_LIMIT
    assert size("'one\\ntwo'")[1]
    assert size("f'pools: {listing(names, 50)}'")[0] == len("pools: ") + 50 + len(" and 9999 more")
    assert size("f'at {current}'") == (3 + PLACEHOLDER, False)


def test_listing_stays_in_its_room() -> None:
    names = [f"dataset-{i:03d}" for i in range(200)]
    text = listing(names, 60, every="lanpo pool list")
    assert text.startswith("dataset-000, dataset-001") and text.endswith(" more (`lanpo pool list`)")
    assert len(text.split(" and ")[0]) <= 60 and str(200 - text.count(",") - 1) in text
    assert listing(["a", "b"]) == "a, b" and listing([]) == ""


def assert_one_error_and_a_short_hint(result: Any) -> str:
    """Exit 2, one `error:` line, one `hint:` line under HINT_LIMIT characters, no traceback; the hint."""
    assert result.code == 2, result.out + result.err
    assert "Traceback" not in result.out + result.err
    lines = result.err.splitlines()
    assert sum(line.startswith("error: ") for line in lines) == 1, result.err
    hints = [line.removeprefix("  hint: ") for line in lines if line.startswith("  hint: ")]
    assert len(hints) == 1 and len(hints[0]) < HINT_LIMIT, result.err
    return hints[0]


def test_an_unknown_revision_points_to_the_history(run_cli: Callable[..., Any]) -> None:
    head = migrate.head_revision()
    hint = assert_one_error_and_a_short_hint(run_cli("db", "downgrade", "nosuchrev"))
    assert hint.startswith(f"the database is at {head}; `lanpo db history` lists the revisions")
    history = run_cli("db", "history")
    assert history.code == 0, history.err
    lines = history.out.splitlines()
    assert [line.split()[0] for line in lines] == [revision for revision, _ in migrate.revisions()]
    assert lines[0].startswith("0001  experience store") and lines[-1].endswith("(head, current)")
    assert run_cli("db", "downgrade", lines[-2].split()[0]).code == 0  # an id it prints is a REVISION
    assert run_cli("db", "history").out.splitlines()[-2].endswith("(current)")
    assert run_cli("db", "upgrade").code == 0


@pytest.fixture
def crowded_store(session: Session) -> None:
    """Sixty datasets and sixty pools with long names: a hint that listed them all would run to thousands."""
    for i in range(60):
        upsert_problems(session, f"a-dataset-with-a-rather-long-name-{i:02d}", [Question("0", "What is 1+1?", "2")])
        ensure_pool(session, f"a-pool-with-a-rather-long-name-{i:02d}", StoreConfig())
    session.commit()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("pool", "stats", "--dataset", "nosuch"), "datasets in the store: a-dataset-with"),
        (("pool", "stats", "--pool", "nosuch"), "pools in the store: a-pool-with"),
        (("retrieve", "What is 1+1?", "--scorer", "none", "--stage1", "bm25"), "pass --pool NAME, one of: a-pool"),
        (("pool", "context", "--problem", "nosuch:1", "--mode", "intra"), "datasets in the store: a-dataset-with"),
    ],
)
def test_hints_that_list_the_store_stay_short(
    args: tuple[str, ...], says: str, run_cli: Callable[..., Any], crowded_store: None
) -> None:
    hint = assert_one_error_and_a_short_hint(run_cli(*args))
    assert hint.startswith(says) and re.search(r" and \d+ more", hint), hint


def test_sql_for_an_administrator_goes_under_the_hint(capsys: pytest.CaptureFixture[str]) -> None:
    """`detail` (SQL to copy) is printed under the one-line hint, indented, and is not part of it."""
    from lanpo.cli import _fail

    error = LanpoError("may not create the extension vector", "an administrator runs this", "CREATE EXTENSION vector;")
    assert _fail(error.message, error.hint, 2, 0, error.detail) == 2
    assert capsys.readouterr().err == (
        "error: may not create the extension vector\n"
        "  hint: an administrator runs this\n"
        "\n"
        "    CREATE EXTENSION vector;\n"
    )
    assert str(error).endswith("  hint: an administrator runs this\n\n    CREATE EXTENSION vector;")
