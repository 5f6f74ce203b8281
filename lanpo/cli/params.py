"""Click parameter types that refuse what no command can use: integers beyond int64, NaN and infinity."""

from __future__ import annotations

import math
from typing import Any

import click

from lanpo.db.repo.checks import BIGINT_MAX


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


SEED = Int(-(2**63), BIGINT_MAX)  # a signed 64-bit seed, what the SQL hash and torch accept
