"""lanpo's imports, read from the source with `ast`, against the layers they should keep.

- Inside `lanpo/train`, every module sits in one of `TRAIN_LAYERS` (bottom first) and imports from its own layer
  or the ones below, never above, but for type hints (under `if TYPE_CHECKING:`, which never runs).
- No import cycle among lanpo's modules (function-level imports count: they run; a module's import of its own
  package, the package's face, does not).
- `lanpo/integrations/*` and `lanpo/feedback/*` (the store's client layer) import no `lanpo.train` module, and
  `lanpo/serve` none either.
- `lanpo/integrations/*` (the TRL and verl adapters) reach the store through `lanpo.feedback` alone: of `lanpo.db`
  they import only the store's handle (`lanpo.db.connection.open_store`) and its errors (`lanpo.db.errors`).
- The pure core (`lanpo.rewards`, `lanpo.seeds`, `lanpo.prompts`, `lanpo.rl`, `lanpo.config`, `lanpo.diagnostics`)
  loads no SQLAlchemy.

A failure names each offending import as `file:line -> module`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lanpo"

# lanpo/train's layers, bottom first, by the name under lanpo.train (a module, or a folder and all in it).
TRAIN_LAYERS: list[tuple[str, ...]] = [
    ("plumbing",),  # ranks, FSDP, checkpoints, phase timers, the step line: what a step runs on
    ("grpo_config", "config", "plan_shapes", "plan_tokens", "plan_verl", "parts", "run"),  # settings, the run
    ("forward",),  # the policy's forwards: padded batches, log-probs, the chunked head
    ("policy",),  # what trains, and its reference
    ("consumer",),  # the update
    ("sft", "mel", "plan", "plan_verdict"),  # what builds on the update: the warm start, MEL, the memory plan
    ("start",),  # the model RL starts from (the warm start merged), for the trainer and its workers
    ("producer",),  # contexts, rollouts, grades, summaries; the served policy, the rollout queue, its workers
    ("replay",),  # `[replay]`: stored trajectories joined to a step's groups, and the tokens it keeps
    ("validate",),
    ("state",),  # everything a step needs, built once
    ("loop",),  # the step
]


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    path: Path
    line: int
    target: str  # the lanpo module it loads (the nearest one the imported name lies in)
    typing_only: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} -> {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _nearest_module(name: str) -> str | None:
    """`name` (a module, or a name inside one) as the lanpo module that defines it; None outside lanpo."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the importing module's package up
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [f"{base}.{alias.name}" for alias in node.names]  # a submodule, or a name that _nearest_module resolves


def _typing_only_nodes(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) block."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


@cache
def _imports() -> tuple[Import, ...]:
    """Every import of a lanpo module by a lanpo module (module level and inside functions alike)."""
    found = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _typing_only_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported_names(module, path, node):
                target = _nearest_module(name)
                if target is not None and target != module:
                    found.append(Import(module, path, node.lineno, target, id(node) in typing_only))
    return tuple(found)


def _distinct(lines: Iterable[str]) -> list[str]:
    """`lines` once each, in order (an import of two names from one module is one line)."""
    return list(dict.fromkeys(lines))


def _train_layer(module: str) -> int | None:
    """The index in TRAIN_LAYERS of a lanpo.train module (None: lanpo.train itself, or not under it)."""
    if not module.startswith("lanpo.train."):
        return None
    first = module.split(".")[2]
    for index, names in enumerate(TRAIN_LAYERS):
        if first in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py's TRAIN_LAYERS: place it")


def test_every_train_module_has_a_layer() -> None:
    for module in _modules():
        _train_layer(module)


def test_no_import_runs_up_the_train_layers() -> None:
    upward = []
    for imp in _imports():
        low, high = _train_layer(imp.target), _train_layer(imp.source)
        if low is not None and high is not None and low > high and not imp.typing_only:
            upward.append(imp)
    unexpected = _distinct(str(imp) for imp in upward)
    assert not unexpected, "imports that run up lanpo/train's layers (TRAIN_LAYERS):\n" + "\n".join(unexpected)


def _is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_face(source: str, target: str) -> bool:
    """Whether `target` is a package that holds `source` (a module importing its own package's `__init__`)."""
    return source.startswith(target + ".")


def _cycle(edges: dict[str, list[Import]]) -> list[Import] | None:
    """One import cycle in `edges` (module -> its imports), as the imports around it; None when there is none."""
    done: set[str] = set()
    on_path: dict[str, int] = {}  # a module on the current path -> the index in `trail` of the import leaving it
    trail: list[Import] = []

    def visit(module: str) -> list[Import] | None:
        on_path[module] = len(trail)
        for imp in edges.get(module, []):
            if imp.target in on_path:
                return [*trail[on_path[imp.target] :], imp]
            if imp.target not in done:
                trail.append(imp)
                found = visit(imp.target)
                if found:
                    return found
                trail.pop()
        del on_path[module]
        done.add(module)
        return None

    for module in sorted(edges):
        found = None if module in done else visit(module)
        if found:
            return found
    return None


def test_no_import_cycle_among_lanpo_modules() -> None:
    edges: dict[str, list[Import]] = {}
    for imp in _imports():
        if not imp.typing_only and not _is_face(imp.source, imp.target):
            edges.setdefault(imp.source, []).append(imp)
    cycle = _cycle(edges)
    assert cycle is None, "an import cycle:\n" + "\n".join(str(imp) for imp in cycle or [])


def test_the_cycle_finder_finds_a_cycle_and_names_its_imports() -> None:
    """The check above on a made-up graph, so that it cannot pass by finding nothing."""
    a, b, c = "lanpo.a", "lanpo.b", "lanpo.c"
    edges = {
        a: [Import(a, PACKAGE / "a.py", 1, b, False)],
        b: [Import(b, PACKAGE / "b.py", 2, c, False)],
        c: [Import(c, PACKAGE / "c.py", 3, a, False)],
    }
    cycle = _cycle(edges)
    assert cycle is not None and [str(imp) for imp in cycle] == [
        "lanpo/a.py:1 -> lanpo.b",
        "lanpo/b.py:2 -> lanpo.c",
        "lanpo/c.py:3 -> lanpo.a",
    ]
    edges[c] = []
    assert _cycle(edges) is None


@pytest.mark.parametrize(
    "folder",
    [
        "integrations",
        "feedback",
        "serve",
    ],
)
def test_the_store_client_and_adapters_import_no_train_module(folder: str) -> None:
    """An adapter (TRL, verl), the store's client layer and the server need what any trainer needs, never
    lanpo.train."""
    assert (PACKAGE / folder).is_dir(), f"lanpo/{folder}/ does not exist"
    package = f"lanpo.{folder}"
    into_train = _distinct(
        str(imp) for imp in _imports() if _is_in(imp.source, package) and _is_in(imp.target, "lanpo.train")
    )
    assert not into_train, f"lanpo/{folder} imports lanpo.train:\n" + "\n".join(into_train)


STORE_HANDLE = {"lanpo.db.connection": {"open_store"}, "lanpo.db.errors": None}  # module -> names (None: any)


def _db_imports_of(package: str) -> list[str]:
    """`file:line -> lanpo.db... name` for each import of lanpo.db by `package` beyond the store's handle."""
    found = []
    for module, path in _modules().items():
        if not _is_in(module, package):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                pairs = [(node.module or "", alias.name) for alias in node.names]
            else:
                continue
            for target, name in pairs:
                dotted = target if name is None else f"{target}.{name}"
                if not _is_in(dotted, "lanpo.db"):
                    continue
                allowed = STORE_HANDLE.get(target, set())
                if name is None or (allowed is not None and name not in allowed):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} -> {dotted}")
    return _distinct(found)


def test_the_adapters_reach_the_store_through_the_store_api_alone() -> None:
    """The TRL and verl adapters open, write and commit runs through lanpo.feedback; no lanpo.db.repo module."""
    reached = _db_imports_of("lanpo.integrations")
    assert not reached, "lanpo/integrations imports lanpo.db beyond open_store and its errors:\n" + "\n".join(reached)


def test_the_store_handle_rule_finds_a_repository_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above on a made-up adapter, so that it cannot pass by finding nothing."""
    fake = tmp_path / "lanpo" / "integrations" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        "from lanpo.db.connection import open_store, transaction\nfrom lanpo.db.repo import runs\n"
        "from lanpo.db.errors import database_error\nimport lanpo.db.heartbeat\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_modules", lambda: {"lanpo.integrations.fake": fake})
    assert _db_imports_of("lanpo.integrations") == [
        "lanpo/integrations/fake.py:1 -> lanpo.db.connection.transaction",
        "lanpo/integrations/fake.py:2 -> lanpo.db.repo.runs",
        "lanpo/integrations/fake.py:4 -> lanpo.db.heartbeat",
    ]


# Run in a fresh interpreter: prints the lanpo import lines that were running when SQLAlchemy was first asked for.
SPY = """
import sys, traceback
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "sqlalchemy":
            lines = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "/lanpo/" in f.filename]
            print("\\n".join(lines))
        return None
sys.meta_path.insert(0, Spy())
import {module}
print("sqlalchemy" in sys.modules)
"""


@pytest.mark.parametrize(
    "module",
    [
        "lanpo.rewards",
        "lanpo.seeds",
        "lanpo.feedback_modes",
        "lanpo.prompts",
        "lanpo.rl",
        "lanpo.config",
        "lanpo.diagnostics",
    ],
)
def test_the_pure_core_loads_no_sqlalchemy(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", SPY.replace("{module}", module)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    *chain, loaded = done.stdout.strip().splitlines()
    through = " -> ".join(chain).replace(f"{ROOT}{os.sep}", "")
    assert loaded == "False", f"import {module} loads sqlalchemy: {through} -> sqlalchemy"
