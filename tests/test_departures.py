"""Every value a paper recipe sets is the paper's, or docs/papers.md gives it a row.

The paper recipes are the TOMLs of train/configs/ built on `ROOTS` (grpo-baseline.toml, eval-paper.toml,
mel-qwen3-8b.toml, eval-mel.toml) through their `base` chains; every other TOML there must be in `CPU_RECIPES`, so
that a new recipe is sorted before it passes. For each key a paper recipe sets (its `base` chain merged, as lanpo's
own loader reads it: `lanpo.config.read_toml`; the value is the loaded config's), one of these holds:

(a) lanpo/papers.toml maps the key (`config = ["FAMILY:key"]`) for one of the recipe's papers, and the value
    equals that paper's, converted where papers.toml's note says lanpo counts in other units (`CONVERT`). A
    recipe's papers are LANPO and verl for grpo-baseline / eval-paper and theirs, MEL and verl for the MEL ones
    (MEL Section 4: "All reinforcement learning training is conducted using the VERL framework");
(b) a row of docs/papers.md names the key in backticks with the recipe's value, `key = value` (a TOML value:
    numbers compare as numbers, strings as strings). The rows are those of "## Every departure" and of
    "## MEL's open choices", the table of the [mel] keys; a row whose first cell names recipes in backticks
    (`mel-qwen3-*`) covers those recipes and the recipes built on them, any other row every recipe;
(c) the key carries no method meaning (`NO_METHOD_MEANING`), or the value is the paper's own choice of arm that
    papers.toml holds no value for (`ARMS`: which table row a recipe is, with the paper's words).
A recipe value changed without its row fails here, with the recipe, the key, both values and the row to add.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lanpo import papers
from lanpo.config import load_toml, read_toml
from lanpo.inference.config import EvalConfig
from lanpo.train.config import TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "train" / "configs"
PAPERS_MD = ROOT / "docs" / "papers.md"
SECTIONS = ("## Every departure", "## MEL's open choices")  # the tables whose rows count as departures

# the recipe each paper recipe descends from -> (the papers it is held to, its config family)
ROOTS = {
    "grpo-baseline": (("lanpo", "verl"), "train"),
    "eval-paper": (("lanpo", "verl"), "eval"),
    "mel-qwen3-8b": (("mel", "verl"), "train"),
    "eval-mel": (("mel", "verl"), "eval"),
}
# recipes for a CPU, held to no paper (docs/papers.md, "The recipes")
CPU_RECIPES = {
    "demo-cpu",
    "learn-cpu",
    "mel-demo-cpu",
    "sft-demo",
    "eval-demo-cpu",
    "reuse-cpu",
    "reuse-hidden-rule-cpu",
}

# (c) keys with no method meaning, "family:key" -> why
NO_METHOD_MEANING = {
    "train:run_name": "the run's name: where its checkpoints, pool and rows are kept",
    "train:seed": "the random seed",
    "eval:sampling.seed": "the sampling seed",
    "train:model.device": "where the model is placed",
    "train:model.gradient_checkpointing": "memory only: activations recomputed in backward, the same gradients",
    "train:sft.data": "the SFT pairs' file (`lanpo sft data --n 3000` writes Section 5's 3K pairs)",
    "train:rollout.vllm.max_lora_rank": "memory only: the engine's LoRA slots, sized to lora.r",
    "eval:model": "the policy evaluated: each run names its own checkpoint (--set model=...)",
    "eval:batch_size": "questions per generation call: throughput only",
    "eval:methods[].name": "a table's row names",
    "eval:methods[].model": "the runs' checkpoints (test_paper_recipes.py holds them to what the runs write)",
    "eval:methods[].adapter": "the SFT start's adapter folder",
    "eval:methods[].pool": "the runs' pools (test_paper_recipes.py holds them to the runs)",
}

# (c) the papers' own choices of arm, which papers.toml holds no value for: ("family:key", value, the paper's words)
ARMS: list[tuple[str, Any, str]] = [
    ("train:feedback.mode", "none", 'LANPO Table 1 "GRPO"; MEL Section 4: "We adopt GRPO ... as the base"'),
    ("train:feedback.mode", "intra", 'LANPO Table 1 "LANPO w/ Intra"'),
    ("train:feedback.mode", "inter", 'LANPO Table 1 "LANPO w/ Inter"'),
    ("train:method", "mel", "MEL (arXiv 2602.10224)"),
    ("train:lora.enabled", False, "no adapter in either paper: verl's actor trains every weight"),
    ("train:summarizer.enabled", False, "GRPO, intra and MEL read no lessons"),
    ("train:summarizer.enabled", True, 'LANPO Section 4.2: "New trajectories are summarized and added back"'),
    ("train:summarizer.always", True, 'Table 2 "GRPO ... w/ Retrieval": a GRPO run keeps a pool for test time'),
    ("eval:modes", ["zero_shot", "retrieval", "self_correct"], 'Table 1 "Inference Mode"'),
    ("eval:modes", ["zero_shot", "retrieval"], "Table 2: Zero-shot, w/ Retrieval"),
    ("eval:modes", ["zero_shot", "self_correct"], "Table 3: Zero-shot, w/ Self-correction"),
    ("eval:modes", ["retrieval", "self_correct"], 'Table 4 "Feedback Type"'),
    ("eval:modes", ["zero_shot"], 'MEL Section 4: "Pass@1 at temperature 0, and Avg@8 and Pass@8"'),
    ("eval:pass_at_1", True, 'MEL Section 4: "we report Pass@1 at temperature 0"'),
]


@dataclass(frozen=True)
class Convert:
    """How lanpo's key counts a papers.toml value, and the words of the entry's note that say so."""

    to_lanpo: Callable[[Any, Any], Any]  # (the paper's value, the loaded config) -> the key's value
    note_says: str  # in the entry's `note` ("": a spelling only, the benchmarks' dataset names)


# (a) papers.toml entries whose key counts in other units than the paper, by "paper.key"
CONVERT = {
    "lanpo.base_model": Convert(lambda v, cfg: f"Qwen/{v}", "the hub id Qwen/Qwen2.5-7B"),
    "lanpo.second_model": Convert(lambda v, cfg: f"Qwen/{v}-Base", "the hub id Qwen/Qwen3-14B-Base"),
    "lanpo.train_dataset": Convert(lambda v, cfg: "dapo17k", "imported as dapo17k"),
    "lanpo.ppo_minibatch_prompts": Convert(lambda v, cfg: v * cfg.rollout.n, "64 x rollout.n"),
    "mel.minibatch_prompts": Convert(lambda v, cfg: v * cfg.rollout.n, "128 x rollout.n"),
    "mel.models": Convert(lambda v, cfg: tuple(f"Qwen/{m}" for m in v), ""),  # the hub ids
    "lanpo.eval_datasets": Convert(lambda v, cfg: tuple(n.lower() for n in v), ""),  # dataset names, lower case
}
# (a) papers.toml entries with no `config` that still give a key's values: Table 3's p_t rows, GRPO's 0.0 among them
UNMAPPED = {("train", "feedback.p_t"): [("lanpo", "p_t_ablation")]}


# --------------------------------------------------------------------------- the recipes


def _name(path: Path) -> str:
    return path.relative_to(CONFIGS).with_suffix("").as_posix()


@functools.cache
def chain(name: str) -> tuple[str, ...]:
    """The recipe and the recipes it is built on, itself first."""
    path = CONFIGS / f"{name}.toml"
    base = tomllib.loads(path.read_text(encoding="utf-8")).get("base")
    return (name,) if base is None else (name, *chain(_name((path.parent / base).resolve())))


ALL_RECIPES = sorted(_name(p) for p in CONFIGS.rglob("*.toml"))
PAPER_RECIPES = [n for n in ALL_RECIPES if chain(n)[-1] in ROOTS]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a TOML mapping; a list of tables becomes `key[].field` per field."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for field in dict.fromkeys(f for v in value for f in v):
                out[f"{prefix}{key}[].{field}"] = [v.get(field) for v in value]
        else:
            out[f"{prefix}{key}"] = value
    return out


def loaded_value(cfg: Any, key: str) -> Any:
    """The value of dotted `key` in a loaded config (`a[].b`: every item's b)."""
    node = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.endswith("[]"):
            return [loaded_value(item, ".".join(parts[i + 1 :])) for item in getattr(node, part[:-2])]
        node = getattr(node, part)
    return list(node) if isinstance(node, tuple) else node


def same(a: Any, b: Any) -> bool:
    """Equal as TOML values: numbers as numbers, booleans and strings as themselves, lists item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def toml_text(value: Any) -> str:
    """`value` as a TOML value, for the `key = value` a row would name."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return repr(value)


# --------------------------------------------------------------------------- the rows of docs/papers.md


@dataclass(frozen=True)
class Row:
    line: int
    scope: tuple[str, ...]  # recipe patterns from the first cell; () = every recipe
    values: tuple[tuple[str, Any], ...]  # every `key = value` the row names


CODE = re.compile(r"`([^`]+)`")
KEY_VALUE = re.compile(r"([a-z_][a-z0-9_]*(?:\[\])?(?:\.[a-z_][a-z0-9_]*)*)\s*=\s*(.+)")


def cells(line: str) -> list[str]:
    """A table line's cells; `\\|` is a pipe inside a cell (as GitHub reads it), not a border."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_lines(text: str) -> list[tuple[int, list[str], int]]:
    """(line number, cells, the header's cell count) of each body row of the tables in `SECTIONS`."""
    out, section, header = [], None, None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            section = line.strip()
        if not line.lstrip().startswith("|"):
            header = None
            continue
        if section not in SECTIONS or re.match(r"\s*\|\s*-", line):
            continue
        if header is None:
            header = len(cells(line))
            continue
        out.append((number, cells(line), header))
    return out


def rows_of(text: str) -> list[Row]:
    """The departure rows of docs/papers.md's text: each one's scope and the `key = value` spans it names."""
    rows = []
    for number, row, _ in table_lines(text):
        scope = tuple(s.removesuffix(".toml") for s in CODE.findall(row[0]) if "=" not in s)
        values = []
        for span in (span for cell in row for span in CODE.findall(cell)):
            match = KEY_VALUE.fullmatch(span.strip())
            if match:
                with contextlib.suppress(tomllib.TOMLDecodeError):  # `key=...` prose, not a value
                    values.append((match.group(1), tomllib.loads(f"v = {match.group(2)}")["v"]))
        rows.append(Row(number, scope, tuple(values)))
    return rows


def covers(row: Row, recipe: str) -> bool:
    """Whether the row speaks for `recipe`: it names no recipe, or `recipe` or one it is built on."""
    return not row.scope or any(fnmatch.fnmatch(n, p) for n in chain(recipe) for p in row.scope)


# --------------------------------------------------------------------------- the walk


def load(recipe: str) -> tuple[str, Any, dict[str, Any]]:
    """(family, the loaded config, the keys its TOML sets with their TOML values)."""
    family = ROOTS[chain(recipe)[-1]][1]
    path = CONFIGS / f"{recipe}.toml"
    if family == "train":
        return family, load_config(path, world=8), flatten(read_toml(path, cls=TrainConfig))
    return family, load_toml(EvalConfig, path), flatten(read_toml(path, cls=EvalConfig))


def held_to(recipe: str) -> tuple[str, ...]:
    """The papers (lanpo/papers.toml's sources) a paper recipe is held to."""
    return ROOTS[chain(recipe)[-1]][0]


def papers_values(recipe: str, family: str, key: str) -> list[papers.PaperValue]:
    """The values of the recipe's papers that lanpo/papers.toml maps to `family:key`."""
    found = [e for e in papers.for_config_key(family, key) if e.paper in held_to(recipe)]
    extra = UNMAPPED.get((family, key), [])
    return found + [e for e in papers.entries() if (e.paper, e.key) in extra and e.paper in held_to(recipe)]


def paper_has(entry: papers.PaperValue, value: Any, cfg: Any) -> bool:
    """Whether the key's `value` is the entry's, in lanpo's units."""
    convert = CONVERT.get(f"{entry.paper}.{entry.key}")
    want = convert.to_lanpo(entry.value, cfg) if convert else entry.value
    if isinstance(want, tuple) and not isinstance(value, list | tuple):  # a list of the paper's choices
        return any(same(value, w) for w in want)
    return same(value, want)


def allowed(family: str, key: str, value: Any) -> bool:
    """(c): a key with no method meaning, or a value that is the paper's arm."""
    name = f"{family}:{key}"
    return name in NO_METHOD_MEANING or any(k == name and same(value, v) for k, v, _ in ARMS)


def problems_of(recipe: str, papers_md: Path) -> list[str]:
    """One line per key of `recipe` that is not the paper's value, has no row in `papers_md` and is not allowed."""
    family, cfg, keys = load(recipe)
    rows = [r for r in rows_of(papers_md.read_text(encoding="utf-8")) if covers(r, recipe)]
    out = []
    for key in keys:
        value = loaded_value(cfg, key)
        entries = papers_values(recipe, family, key)
        if any(paper_has(e, value, cfg) for e in entries):  # (a)
            continue
        if any(k == key and same(value, v) for r in rows for k, v in r.values):  # (b)
            continue
        if allowed(family, key, value):  # (c)
            continue
        if entries:
            paper = "; ".join(f"{e.paper} {e.key} = {toml_text(e.value)} ({e.cites()})" for e in entries)
        else:
            sources = " or ".join(held_to(recipe))
            paper = f"the paper is silent (lanpo/papers.toml maps no value of {sources} to {family}:{key})"
        named = f"`{key} = {toml_text(value)}`".replace("|", "\\|")  # a pipe inside a table cell is escaped
        out.append(
            f"train/configs/{recipe}.toml: {key} = {toml_text(value)}; the paper's value: {paper}. Add a row to "
            f"docs/papers.md \"## Every departure\" naming {named} (the paper's words, lanpo's value, why), or set "
            "the paper's value"
        )
    return out


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_recipe_values_are_the_papers_or_have_a_departure_row(recipe: str) -> None:
    """(a), (b) or (c) of the module's docstring, for every key the recipe sets."""
    problems = problems_of(recipe, PAPERS_MD)
    assert not problems, "\n".join(problems)


def test_every_recipe_is_a_paper_recipe_or_a_cpu_one() -> None:
    assert set(ROOTS) <= set(PAPER_RECIPES), set(ROOTS) - set(PAPER_RECIPES)
    assert set(ALL_RECIPES) - set(PAPER_RECIPES) == CPU_RECIPES, (
        "a recipe of train/configs/ neither built on one of ROOTS nor in CPU_RECIPES: a paper recipe names its base, "
        "a CPU recipe goes into CPU_RECIPES"
    )


def test_departure_rows_keep_their_cells_and_name_real_recipes() -> None:
    """A `|` left unescaped inside a cell would split it (and hide its values from the walk); a row's scope must
    name recipes that exist."""
    text = PAPERS_MD.read_text(encoding="utf-8")
    lines = table_lines(text)
    assert len(lines) > 30, f"the departure tables of {PAPERS_MD} read as {len(lines)} rows"
    for number, row, header in lines:
        assert len(row) == header, f"docs/papers.md:{number}: {len(row)} cells under a header of {header}"
    for row in rows_of(text):
        for pattern in row.scope:
            assert fnmatch.filter(ALL_RECIPES, pattern), f"docs/papers.md:{row.line}: `{pattern}` names no recipe"


def test_the_allow_lists_and_conversions_are_in_use() -> None:
    """Nothing here outlives its use: every key and arm is set by some paper recipe, and every conversion is one
    that papers.toml's note states."""
    loaded = {recipe: load(recipe) for recipe in PAPER_RECIPES}
    set_keys = {f"{family}:{key}" for family, _, keys in loaded.values() for key in keys}
    assert set(NO_METHOD_MEANING) <= set_keys, set(NO_METHOD_MEANING) - set_keys
    for key, value, _ in ARMS:
        family, _, name = key.partition(":")
        assert any(
            f == family and name in keys and same(loaded_value(cfg, name), value) for f, cfg, keys in loaded.values()
        ), f"no paper recipe sets {key} = {toml_text(value)}"
    entries = {f"{e.paper}.{e.key}": e for e in papers.entries()}
    for name, convert in CONVERT.items():
        assert convert.note_says in entries[name].note, (
            f"lanpo/papers.toml's {name} note does not say {convert.note_says!r}"
        )
