"""The papers' settings with their sources, read from `lanpo/papers.toml` (their one home) as typed entries.

The recipes' tests (tests/train/test_paper_recipes.py) hold train/configs/ to these values, and
docs/configuration.md (`python -m lanpo.docgen`) shows each beside the config key it maps to.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAPERS_FILE = Path(__file__).with_name("papers.toml")
FAMILIES = ("train", "eval", "experiment")  # the config files a `config` entry names: FAMILY:KEY


@dataclass(frozen=True)
class Paper:
    """A source of values: a paper (or the framework whose defaults a paper inherits)."""

    name: str  # lanpo | mel | verl
    title: str
    arxiv: str  # "" where it is no paper


@dataclass(frozen=True)
class PaperValue:
    """One setting of a paper: its value, where the paper says it, and the config keys it maps to."""

    paper: str
    key: str
    value: Any  # str | int | float | tuple (a TOML list)
    source: str  # section, table or appendix
    quote: str  # the paper's words
    config: tuple[tuple[str, str], ...]  # (family, key), e.g. ("train", "grpo.learning_rate")
    note: str = ""  # how lanpo's key counts it, where the units differ

    def cites(self) -> str:
        """`source: "quote"`, as the docs show it."""
        return f'{self.source}: "{self.quote}"'


@functools.cache
def _load() -> tuple[dict[str, Paper], tuple[PaperValue, ...]]:
    data = tomllib.loads(PAPERS_FILE.read_text(encoding="utf-8"))
    papers = {name: Paper(name, p["title"], p["arxiv"]) for name, p in data.pop("papers").items()}
    entries = []
    for paper, table in data.items():
        if paper not in papers:
            raise ValueError(f"{PAPERS_FILE}: [{paper}.*] names no [papers.{paper}]")
        for key, entry in table.items():
            config = tuple(_config_key(c, f"{paper}.{key}") for c in entry.get("config", ()))
            value = tuple(entry["value"]) if isinstance(entry["value"], list) else entry["value"]
            entries.append(
                PaperValue(paper, key, value, entry["source"], entry["quote"], config, entry.get("note", ""))
            )
    return papers, tuple(entries)


def _config_key(text: str, where: str) -> tuple[str, str]:
    family, _, key = text.partition(":")
    if family not in FAMILIES or not key:
        raise ValueError(f"{PAPERS_FILE}: {where}: config entry {text!r} must be FAMILY:KEY, FAMILY one of {FAMILIES}")
    return family, key


def papers() -> dict[str, Paper]:
    """Every source, by name."""
    return dict(_load()[0])


def entries(paper: str | None = None) -> list[PaperValue]:
    """Every value (of `paper` only, when given), in the file's order."""
    return [e for e in _load()[1] if paper is None or e.paper == paper]


def values(paper: str) -> dict[str, Any]:
    """`paper`'s values by key: the table the recipe tests read."""
    found = {e.key: e.value for e in entries(paper)}
    if not found:
        raise KeyError(f"no values of paper {paper!r} in {PAPERS_FILE}")
    return found


def for_config_key(family: str, key: str) -> list[PaperValue]:
    """The values that map to config key `key` of `family` (train | eval | experiment)."""
    return [e for e in _load()[1] if (family, key) in e.config]
