"""`--keys`: print every key a TOML recipe may set (with its default and help) and exit, before anything loads."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import click


def keys_option(config_class: str) -> Callable[[Any], Any]:
    """A click option `--keys` for the dataclass at `module:Class` (imported only when asked)."""

    def show(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if not value or ctx.resilient_parsing:
            return
        from lanpo.config import keys_text

        module, name = config_class.split(":")
        click.echo(keys_text(getattr(importlib.import_module(module), name)))
        ctx.exit()

    return click.option(
        "--keys",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="List every config key (TOML `[section] key`, or --set section.key=VALUE) with its default, and exit.",
    )
