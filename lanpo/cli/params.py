"""Click parameter types that refuse what no command can use (integers beyond int64, NaN and infinity), and options
whose default and help come from a config dataclass's field."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from lanpo.config import field_default, field_help
from lanpo.db.repo.checks import BIGINT_MAX

F = TypeVar("F", bound=Callable[..., Any])


class Int(click.IntRange):
    """An integer in [min, max]; max defaults to the int64 limit, since ids, seeds and counts reach SQL or torch."""

    def __init__(self, min: int | None = None, max: int | None = BIGINT_MAX) -> None:
        super().__init__(min, max)


class Float(click.FloatRange):
    """A finite float in [min, max] (click's FloatRange lets NaN through: every comparison with it is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        return "finite" if self.min is None and self.max is None else super()._describe_range()


VLLM_SETTINGS = click.option(
    "--vllm",
    "vllm_settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A vLLM engine setting (lanpo.rollout.config.VLLMConfig), e.g. --vllm memory_fraction=0.3 (repeatable).",
)

SEED = Int(-(2**63), BIGINT_MAX)  # a signed 64-bit seed, what the SQL hash and torch accept


def recipe_option(help: str, required: bool = True) -> Callable[[F], F]:
    """`--config FILE`, the command's TOML, handed to it as the Path `config_path`."""
    path = click.Path(dir_okay=False, path_type=Path)
    return click.option("--config", "config_path", required=required, default=None, type=path, help=help)


def set_option(help: str) -> Callable[[F], F]:
    """`--set KEY=VALUE`, repeatable: overrides of the TOML's keys, handed to the command as the tuple `overrides`."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help)


def field_option(
    cls: type, name: str, *decls: str, help: str | None = None, old: str | None = None, **kwargs: Any
) -> Callable[[F], F]:
    """A click option whose default and help are dataclass `cls`'s field `name`, so that the two cannot drift.

    `decls` default to `--<name with dashes>`; `help` replaces the field's help where the CLI says it otherwise;
    `old` is the flag's old spelling (`--scorer`), still accepted and named as such in the help.
    """
    default = kwargs.pop("default") if "default" in kwargs else field_default(cls, name)
    text = help if help is not None else _sentence(field_help(cls, name))
    if old is not None:
        decls = (*decls, old) if decls else (f"--{name.replace('_', '-')}", old, name)  # the parameter keeps `name`
        text = f"{text.removesuffix('.')} ({old}: the old spelling)."
    kwargs.setdefault("show_default", default is not None)
    return click.option(*(decls or (f"--{name.replace('_', '-')}",)), default=default, help=text, **kwargs)


def _sentence(text: str) -> str:
    """A field's lower-case help as option help: capitalised, with a full stop."""
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."
