"""docs/configuration.md from the config dataclasses: every TOML key with its type, default and help, and the
paper's value with its source (lanpo/papers.toml) where the paper gives one.

`config_keys(family)` is the key list the page is made of; tests/test_docs.py checks every config key the docs
name against it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from lanpo import papers
from lanpo.config import field_default

REGENERATE = "python -m lanpo.docgen"


@dataclass(frozen=True)
class Family:
    """One kind of config file: its name in lanpo/papers.toml, its dataclass, and the commands that read it."""

    name: str  # train | eval | experiment
    title: str
    module: str  # where the dataclass lives, "module:Class"
    read_by: str


FAMILIES = (
    Family(
        "train",
        "Training recipes",
        "lanpo.train.config:TrainConfig",
        "`lanpo train --config`, `lanpo sft --config`, `lanpo demo --config` and the `recipe` of an experiment; "
        "`--set key=value` overrides a key, `lanpo train --keys` lists them",
    ),
    Family(
        "eval",
        "Evaluation configs",
        "lanpo.inference.config:EvalConfig",
        "`lanpo eval --config`; `--set key=value` overrides a key, `lanpo eval --keys` lists them. `lanpo infer` "
        "takes the `retrieval` and `sampling` keys as options",
    ),
    Family(
        "experiment",
        "Experiment configs",
        "lanpo.experiment:ExperimentConfig",
        "`lanpo experiment --config`; its `--set key=value` overrides a key of the shared training recipe",
    ),
)
ARRAY = "array of tables"  # a list of dataclasses: TOML's [[name]] tables
PAPER_NAMES = {"lanpo": "LANPO", "mel": "MEL", "verl": "verl default"}


@dataclass(frozen=True)
class Key:
    """One TOML key (or table) of a config family."""

    key: str  # dotted from the file's top: "rollout.vllm.seed"; a [[table]]'s keys as "datasets[].name"
    type: str
    default: str
    help: str
    table: type | None  # the dataclass of a table (None: a value)


def dataclass_of(family: Family) -> type:
    """The family's dataclass, imported on first use."""
    import importlib

    module, name = family.module.split(":")
    return getattr(importlib.import_module(module), name)


def family(name: str) -> Family:
    """The family called `name`."""
    return next(f for f in FAMILIES if f.name == name)


def _item_dataclass(tp: Any) -> type | None:
    """The dataclass of a table (`X`, `X | None`) or of an array of tables (`list[X]`), else None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, list):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)  # type: ignore[misc]
    return tp if dataclasses.is_dataclass(tp) else None


def type_name(tp: Any) -> str:
    """An annotation as the docs write it: `int`, `float | None`, `list[str]`, `table`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        inner = typing.get_args(tp)
        return f"list[{type_name(inner[0])}]" if inner else "list"
    if tp is dict or origin is dict:
        return "table"
    if tp is type(None):
        return "None"
    if dataclasses.is_dataclass(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def toml_value(value: Any) -> str:
    """A default as TOML writes it (None, which TOML cannot write, as "unset")."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def keys(cls: type, prefix: str = "") -> list[Key]:
    """Every key of dataclass `cls`, tables before their own keys, in declaration order."""
    out: list[Key] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        key, tp = f"{prefix}{f.name}", hints[f.name]
        table = _item_dataclass(tp)
        array = typing.get_origin(tp) is list and table is not None
        if table is not None and not array:
            out.append(Key(key, "table", "", f.metadata.get("help", ""), table))
            out += keys(table, f"{key}.")
            continue
        try:
            default = toml_value(field_default(cls, f.name))
        except KeyError:
            default = "(required)"
        out.append(Key(key, ARRAY if array else type_name(tp), default, f.metadata.get("help", ""), table))
        if array:
            assert table is not None
            out += keys(table, f"{key}[].")
    return out


def config_keys(name: str) -> set[str]:
    """Every key and table of family `name` (train | eval | experiment), as `--set` and the docs write them."""
    return {k.key for k in keys(dataclass_of(family(name)))}


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell (a `<name>` placeholder would read as an HTML tag)."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _paper_cell(family_name: str, key: str) -> str:
    parts = []
    for e in papers.for_config_key(family_name, key):
        value = ", ".join(map(str, e.value)) if isinstance(e.value, tuple) else str(e.value)
        note = f"; {e.note}" if e.note else ""
        parts.append(f"{PAPER_NAMES[e.paper]}: `{value}` ({e.cites()}{note})")
    return _cell("<br>".join(parts))


def _check_paper_keys() -> None:
    """Every config key lanpo/papers.toml maps a value to exists (else the page would not show the value)."""
    known = {f.name: config_keys(f.name) for f in FAMILIES}
    for e in papers.entries():
        for family_name, key in e.config:
            if key not in known[family_name]:
                raise ValueError(f"{papers.PAPERS_FILE}: {e.paper}.{e.key} maps to {family_name}:{key}, no such key")


def _table_section(fam: Family, title: str, doc: str, rows: list[Key]) -> list[str]:
    lines = [f"### {title}", ""]
    if doc:
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | meaning | paper |", "| --- | --- | --- | --- | --- |"]
    for k in rows:
        default = f"`{_cell(k.default)}`" if k.default else ""
        lines.append(f"| `{k.key}` | {_cell(k.type)} | {default} | {_cell(k.help)} | {_paper_cell(fam.name, k.key)} |")
    return [*lines, ""]


def _parent(key: str) -> str:
    """The table a key sits in: "rollout.vllm" for "rollout.vllm.seed", "" at the top."""
    return key.rsplit(".", 1)[0] if "." in key else ""


def _family_section(fam: Family) -> list[str]:
    cls = dataclass_of(fam)
    lines = [f"## {fam.title} (`{cls.__name__}`)", "", f"Read by {fam.read_by}.", ""]
    all_keys = keys(cls)
    tables = [("", cls)] + [
        (k.key + ("[]" if k.type == "array of tables" else ""), k.table) for k in all_keys if k.table
    ]
    for name, table in tables:
        assert table is not None
        header = f"`[[{name[:-2]}]]`" if name.endswith("[]") else f"`[{name}]`" if name else "top level"
        rows = [k for k in all_keys if _parent(k.key) == name]
        lines += _table_section(fam, f"{header} ({table.__name__})", table.__doc__ or "", rows)
    return lines


def page() -> str:
    """The whole of docs/configuration.md."""
    _check_paper_keys()
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated by `{REGENERATE}` from the config dataclasses and lanpo/papers.toml: do not edit. -->",
        "",
        f"This page is generated: after changing a config dataclass or `lanpo/papers.toml`, run `{REGENERATE}`",
        "(tests/test_docs.py fails while the page and the code differ).",
        "",
        "**The defaults are for a CPU run**: a small model, short completions, a LoRA adapter, the `hf` backend.",
        "They are not the papers' settings. The papers' values live in the recipes of "
        "[train/configs/](../train/configs/)",
        "(`grpo-baseline.toml` and the LANPO recipes built on it, `mel-qwen3-*.toml`, `eval-paper.toml`, "
        "`eval-mel.toml`);",
        "the column *paper* gives each key's value in the paper with the paper's words, from their one home,",
        "`lanpo/papers.toml` (`verl default`: the value of verl, which the paper trains with, where the paper states",
        "none).",
        "",
        "A key is written dotted from the top of its file: `grpo.learning_rate` is `learning_rate` under `[grpo]` in",
        "TOML, and `--set grpo.learning_rate=1e-6` on the command line. `unset` is a key left out (None).",
        "",
    ]
    for fam in FAMILIES:
        lines += _family_section(fam)
    return "\n".join(lines).rstrip() + "\n"
