"""Configuration as documentation: one dataclass per component, filled from TOML and CLI overrides.

Every component keeps its own `@dataclass` (with one-line field help in `metadata["help"]` and a default for a
run on a CPU; the papers' values live in the recipes of `train/configs/`). This module holds the shared machinery:
building a dataclass from a mapping with unknown keys and wrong types rejected by name, loading TOML, and
`a.b=value` overrides.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import math
import os
import tomllib
import types
import typing
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lanpo.errors import ConfigError, listing, nearest_first

T = TypeVar("T")
log = logging.getLogger(__name__)

EVICTION_POLICIES = ("oldest", "lowest_reward", "lowest_relevance", "lowest_utility")
# store.merge_keeps: which text a near-duplicate's merge keeps as the lesson's new version (lanpo.merging)
MERGE_KEEPS = ("newer", "higher_reward")
# the model dtypes a config or a --dtype option may name (lanpo.models.DTYPES maps them to torch dtypes)
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


def check(cond: bool, message: str, hint: str | None = None) -> None:
    """A config dataclass's `__post_init__` check: ConfigError(message, hint) unless `cond`."""
    if not cond:
        raise ConfigError(message, hint=hint)


def help_field(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text documents it (`lanpo train --keys` and `lanpo eval --keys` print them)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kwargs)
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass
class StoreConfig:
    """The run's experience pool: its name and the capacity settings it is created with."""

    pool: str | None = help_field(
        None, "pool the run reads and writes (None: a pool named after the run; a shared name shares on purpose)"
    )
    per_problem_cap: int = help_field(32, "active experiences kept per problem (paper: 32)")
    per_step_cap: int = help_field(8, "new experiences admitted per problem per training step (the paper recipes: 8)")
    global_cap: int | None = help_field(None, "active experiences kept in the whole pool (None: unbounded)")
    eviction: str = help_field(
        "oldest",
        "what leaves first when a cap is hit: oldest | lowest_reward | lowest_relevance | lowest_utility (the "
        "lowest expected lift: a lesson with min_uses uses or more at its lift shrunk toward 0, an untried one at 0)",
    )
    min_uses: int = help_field(
        4, "lowest_utility: uses with a known outcome a lesson's current version needs before its lift counts"
    )
    merge_threshold: float | None = help_field(
        None,
        "cosine similarity (all-MiniLM-L6-v2) at or above which a new lesson becomes a new version of an active "
        "lesson of its own problem, when both name the same numbers and operations (None: never merge; the paper "
        "keeps every lesson; ACE merges at 0.9)",
    )
    merge_keeps: str = help_field(
        "newer",
        "the text a merge keeps -- newer (the later policy's wording, a new version) | higher_reward (the new text "
        "only when its rollout scored higher; else the duplicate is dropped and counted)",
    )
    max_policy_age: int | None = help_field(
        None,
        "retire a lesson whose current version a policy wrote more than this many steps (policy updates) before the "
        "writing run's step, as expired:policy_age (None: lessons never expire; the paper's never do)",
    )
    baseline_half_life: float = help_field(
        2.0, "a training use with no same-step zero-shot group of its problem is compared with an estimate from the "
        "run's zero-shot attempts at the 4 x this many steps before its own, each weighing half as much per this many "
        "steps back (0: exact same-step baselines only)")  # fmt: skip
    baseline_prior: float = help_field(
        2.0, "the estimate's prior, all problems' zero-shot success there, worth this many of the problem's own "
        "attempts (0: no estimate for a problem with none of its own in that span)")  # fmt: skip
    retire_below: float | None = help_field(
        None, "retire a lesson (retired:harmful) whose current version has min_uses known uses and a lift whose 95% "
        "interval lies below this (0.0: confidently harmful; None: never, as in the papers)")  # fmt: skip

    def __post_init__(self) -> None:
        if self.pool is not None and not self.pool.strip():
            raise ConfigError("store.pool must be a pool name or unset", hint="leave it out to use the run's name")
        if self.per_problem_cap < 1:
            raise ConfigError(f"store.per_problem_cap must be >= 1, got {self.per_problem_cap}")
        if self.per_step_cap < 1:
            raise ConfigError(f"store.per_step_cap must be >= 1, got {self.per_step_cap}")
        if self.global_cap is not None and self.global_cap < 1:
            raise ConfigError(f"store.global_cap must be >= 1 or unset, got {self.global_cap}")
        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError(f"store.eviction must be one of {', '.join(EVICTION_POLICIES)}, got {self.eviction!r}")
        if self.min_uses < 1:
            raise ConfigError(f"store.min_uses must be >= 1, got {self.min_uses}")
        if self.merge_threshold is not None and not 0.0 < self.merge_threshold <= 1.0:
            raise ConfigError(
                f"store.merge_threshold must be in (0, 1] or unset, got {self.merge_threshold}",
                hint="0.9 merges close paraphrases (ACE's threshold); leave it out to keep every lesson",
            )
        if self.merge_keeps not in MERGE_KEEPS:
            raise ConfigError(f"store.merge_keeps must be one of {', '.join(MERGE_KEEPS)}, got {self.merge_keeps!r}")
        if self.max_policy_age is not None and self.max_policy_age < 1:
            raise ConfigError(f"store.max_policy_age must be >= 1 or unset, got {self.max_policy_age}")
        hint = "the defaults (2, 2) estimate from a few steps; baseline_half_life = 0 keeps exact ones only"
        for name, value in (("baseline_half_life", self.baseline_half_life), ("baseline_prior", self.baseline_prior)):
            check(math.isfinite(value) and value >= 0, f"store.{name} must be a finite number >= 0, got {value}", hint)
        below = self.retire_below
        check(below is None or (math.isfinite(below) and -1 < below <= 1),
              f"store.retire_below must be in (-1, 1] or unset, got {below}",
              "a lift lies in [-1, 1]; 0.0 retires a lesson whose lift is confidently below zero")  # fmt: skip


def default_embedding_dim() -> int:
    """The embedding dimension for new databases: `LANPO_EMBEDDING_DIM`, else 384."""
    raw = os.environ.get("LANPO_EMBEDDING_DIM", "384")
    try:
        dim = int(raw)
    except ValueError as exc:
        raise ConfigError(f"LANPO_EMBEDDING_DIM must be an integer, got {raw!r}") from exc
    if dim < 1:
        raise ConfigError(f"LANPO_EMBEDDING_DIM must be >= 1, got {dim}")
    return dim


def lanpo_home() -> Path:
    """Where lanpo keeps its embedded database, model cache and runs: `$LANPO_HOME`, else `~/.lanpo`."""
    return Path(os.environ.get("LANPO_HOME", "~/.lanpo")).expanduser()


# --------------------------------------------------------------------------- building from mappings


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against annotation `tp`, recursing into nested dataclasses; int is accepted for float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {type(value).__name__}")
        return from_mapping(tp, value, prefix=f"{key}.")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {type(value).__name__}")
        (item_tp, *_rest) = typing.get_args(tp) or (Any,)
        return origin(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a table, got {type(value).__name__}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{key} must be a finite number, got {value}") from None
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value}")
    if tp is int and isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise ConfigError(f"{key} must be a 64-bit integer, got {value}")
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{key} must be int, got bool")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {type(value).__name__} ({value!r})")
    return value


# --------------------------------------------------------------------------- renamed keys


@dataclass(frozen=True)
class Renamed:
    """The old name of a config key: a dataclass lists its own in `RENAMED = {old: Renamed(new)}` (a ClassVar).

    `new` is the key's path today, dotted from the same table (`"inter.gamma"`); `values` translates old values to
    today's (an old value it does not list is refused). Every way a key comes in reads the old name as the new one,
    with one warning line naming both: a TOML table (`from_mapping`, so a stored `runs.config` or experiment
    identity too), a `--set a.b=value` override and an experiment's arm table (`upgrade_path`). The old and the new
    name together are refused.
    """

    new: str
    values: dict[Any, Any] = field(default_factory=dict)

    def translate(self, value: Any, old_key: str, new_key: str) -> Any:
        """`value` as the new key takes it."""
        if not self.values:
            return value
        if isinstance(value, Hashable) and value in self.values:
            return self.values[value]
        olds = ", ".join(str(v) for v in self.values)
        news = " | ".join(str(self.values[v]) for v in self.values)
        raise ConfigError(
            f"{old_key} must be one of {olds}, got {value!r}",
            hint=f"{old_key} is the old name of {new_key}: set {new_key} = {news}",
        )


_QUIET_RENAMES: contextvars.ContextVar[bool] = contextvars.ContextVar("quiet_renames", default=False)


@contextmanager
def quiet_renames() -> Iterator[None]:
    """Read old key names without the warning (a stored identity, which the user cannot rewrite)."""
    token = _QUIET_RENAMES.set(True)
    try:
        yield
    finally:
        _QUIET_RENAMES.reset(token)


def _warn_renamed(old_key: str, new_key: str, old: Any = None, new: Any = None, translated: bool = False) -> None:
    """The one warning line of an old key name read as `new_key` (naming the values too where they changed)."""
    if _QUIET_RENAMES.get():
        return
    if not translated:
        log.warning("config key %s is deprecated: read as %s (rename it there)", old_key, new_key)
    else:
        log.warning("config key %s is deprecated: %s = %r is read as %s = %r", old_key, old_key, old, new_key, new)


def _renames(cls: Any) -> dict[str, Renamed]:
    return getattr(cls, "RENAMED", {}) if dataclasses.is_dataclass(cls) else {}


def _table_type(cls: Any, name: str) -> Any:
    """The dataclass type of `cls`'s field `name` (None when it is not a table of fields)."""
    return _tables(cls).get(name) if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


@functools.cache
def _tables(cls: type) -> dict[str, type]:
    """Field name -> dataclass type, for the fields of dataclass `cls` that are tables (an optional one too)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
        if dataclasses.is_dataclass(tp):
            out[f.name] = tp
    return out


def upgrade_keys(cls: type, data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`data` (a copy) with the old key names of `cls` and of its nested tables moved to today's (`Renamed`)."""
    out = dict(data)
    for old, renamed in _renames(cls).items():
        if old not in out:
            continue
        value = out.pop(old)
        *parents, leaf = renamed.new.split(".")
        old_key, new_key = f"{prefix}{old}", f"{prefix}{renamed.new}"
        node = out
        for i, part in enumerate(parents):
            child = node.get(part, {})
            if not isinstance(child, dict):
                table = prefix + ".".join(parents[: i + 1])
                raise ConfigError(
                    f"{old_key} (the old name of {new_key}) goes into {table}, which is not a table here",
                    hint=f"write {table} as a table, [{table}], and set {new_key} in it",
                )
            node[part] = child = dict(child)
            node = child
        if leaf in node:
            raise ConfigError(
                f"{old_key} and {new_key} are both set: {old_key} is the old name of {new_key}",
                hint=f"keep {new_key} and remove {old_key}",
            )
        node[leaf] = renamed.translate(value, old_key, new_key)
        _warn_renamed(old_key, new_key, value, node[leaf], bool(renamed.values))
    for name, value in out.items():
        table = _table_type(cls, name)
        if table is not None and isinstance(value, dict):
            out[name] = upgrade_keys(table, value, f"{prefix}{name}.")
    return out


def upgrade_path(cls: type, path: list[str], value: Any) -> tuple[list[str], Any, bool]:
    """An override's key path and value with old key names read as today's: (path, value, whether one was old)."""
    out: list[str] = []
    rest = list(path)
    node: Any = cls
    renamed_any = False
    while rest:
        part = rest.pop(0)
        renamed = _renames(node).get(part)
        if renamed is not None:
            new_parts = renamed.new.split(".")
            old_key, new_key = ".".join([*out, part]), ".".join([*out, *new_parts, *rest])
            if not rest:
                old_value, value = value, renamed.translate(value, old_key, new_key)
                _warn_renamed(old_key, new_key, old_value, value, bool(renamed.values))
            else:
                _warn_renamed(f"{old_key}.{'.'.join(rest)}", new_key)
            rest = new_parts + rest
            renamed_any = True
            continue
        out.append(part)
        node = _table_type(node, part)
    return out, value, renamed_any


def from_mapping(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from `data`; unknown keys and wrong types raise ConfigError naming the key.

    Old key names (`Renamed`) are read as today's, with a warning."""
    data = upgrade_keys(cls, data, prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} " + ", ".join(f"{prefix}{k}" for k in unknown),
            hint=f"keys allowed{' in ' + prefix.rstrip('.') if prefix else ''}: "
            f"{listing(nearest_first(unknown[0], fields), 90)}; --keys lists them all",
        )
    kwargs = {name: _coerce(value, hints[name], f"{prefix}{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if prefix and not exc.message.startswith(prefix):
            exc.message = exc.message.replace(f"{cls.__name__}.", prefix)
        raise


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value); the value is read as TOML, falling back to a bare string."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value", hint="e.g. --set steps=5")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str], cls: type | None = None) -> dict[str, Any]:
    """Apply `a.b=value` overrides to a nested mapping (a copy); with `cls`, old key names land on today's
    (`upgrade_path`), and an old and a new name of one key among the overrides are refused."""
    out = _deepcopy(data)
    spelled: dict[tuple[str, ...], tuple[str, bool]] = {}  # resolved path -> (the key as written, was it old)
    for text in overrides:
        path, value = parse_override(text)
        if cls is not None:
            written = ".".join(path)
            path, value, old = upgrade_path(cls, path, value)
            seen = spelled.setdefault(tuple(path), (written, old))
            if seen[0] != written and (old or seen[1]):
                raise ConfigError(
                    f"overrides set {seen[0]} and {written}, two names of one key ({'.'.join(path)})",
                    hint=f"set {'.'.join(path)} once",
                )
        set_path(out, path, value, where=f"override {text!r}")
    return out


def set_path(data: dict[str, Any], path: list[str], value: Any, where: str) -> None:
    """`data[a][b]... = value` for path [a, b, ...], creating the tables on the way (in place)."""
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {part} is not a table", hint=f"{part} holds a value; set {part}=... whole")
    node[path[-1]] = value


def _deepcopy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, dict) else v for k, v in data.items()}


BASE_KEY = "base"  # a recipe's `base = "other.toml"`: start from that recipe, then apply this file's keys


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, tables merged key by key (a list or a value replaces the base's whole)."""
    out = _deepcopy(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_toml(path: str | Path, _seen: tuple[Path, ...] = (), cls: type | None = None) -> dict[str, Any]:
    """A TOML recipe as a mapping, its `base` chain resolved (paths relative to the file that names them).

    A variant recipe (a LoRA variant, a Table 2 ablation) names the recipe it departs from and carries only the
    keys that differ, so the two cannot drift apart silently. With `cls`, each file's old key names are read as
    today's (`upgrade_keys`) before the files merge, so a variant's new name overrides its base's old one.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist", hint="recipes live in train/configs/")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file", hint="name a .toml file, not a folder")
    if path.resolve() in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path.resolve()))
        raise ConfigError(f"{path}: `base` recipes form a cycle: {chain}", hint="a recipe cannot be its own base")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", hint="see the recipes in train/configs/") from exc
    base = data.pop(BASE_KEY, None)
    if cls is not None:
        try:
            data = upgrade_keys(cls, data)
        except ConfigError as exc:
            exc.message = f"{path}: {exc.message}"
            raise
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: `base` must name another recipe file, got {base!r}")
    return _merge(read_toml(path.parent / base, (*_seen, path.resolve()), cls), data)


def load_toml(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Load dataclass `cls` from a TOML file (its `base` chain resolved) plus `key=value` overrides."""
    path = Path(path)
    data = read_toml(path, cls=cls)  # old key names read as today's, so that overrides land over them
    try:
        return from_mapping(cls, apply_overrides(data, overrides or [], cls))
    except ConfigError as exc:
        exc.message = f"{path}: {exc.message}"
        exc.hint = exc.hint or f"set a valid value in {path}, or override it with --set key=value"
        raise


def field_default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name` (a fresh one for a default_factory); KeyError if it has none."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]  # type: ignore[arg-type]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise KeyError(f"{cls.__name__}.{name} has no default")


def field_help(cls: type, name: str) -> str:
    """The one-line help of dataclass `cls`'s field `name` (its `metadata["help"]`, "" when it has none)."""
    return {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("help", "")  # type: ignore[arg-type]


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every key of dataclass `cls` (nested ones dotted) as (key, default, help), in declaration order."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows += describe(hints[f.name], f"{key}.")
            continue
        try:
            default = field_default(cls, f.name)
        except KeyError:
            default = "(required)"
        rows.append((key, "unset" if default is None else repr(default), f.metadata.get("help", "")))
    return rows


def keys_text(cls: type) -> str:
    """`describe(cls)` as aligned lines: `key = default  help`."""
    rows = describe(cls)
    width = max(len(f"{k} = {d}") for k, d, _ in rows)
    return "\n".join(f"{f'{k} = {d}':<{width}}  {h}" for k, d, h in rows)


def to_mapping(obj: Any) -> dict[str, Any]:
    """A dataclass as a plain JSON-able dict (for `runs.config`)."""
    return dataclasses.asdict(obj)
