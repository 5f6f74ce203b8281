"""Input checks shared by the repositories: NUL bytes, text size, finite numbers, vector dimensions, JSON.

Policy on NUL bytes (Postgres `text` and `jsonb` cannot hold U+0000): text a *user* supplies (imported
problems) is refused; text a *model* generated (attempt prompts/responses, experience summaries) has its
NUL bytes stripped with a logged warning, so one odd generation cannot abort a training step.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.errors import InputError

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 1_048_576  # 1 MiB per text field (UTF-8)
BIGINT_MAX = 2**63 - 1  # Postgres bigint: every id column, and any integer lanpo passes to SQL


def check_size(text: str, field: str) -> None:
    """Refuse text over MAX_TEXT_BYTES (UTF-8) in `field`."""
    if len(text) * 4 <= MAX_TEXT_BYTES:  # fast path: cannot exceed
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise InputError(
            f"{field} is {size:,} bytes; the limit is {MAX_TEXT_BYTES:,} bytes (1 MiB) per text field",
            hint="shorten it (truncate long generations before recording them)",
        )


def refuse_nul(text: str, field: str) -> None:
    """User text: refuse NUL bytes."""
    if "\x00" in text:
        raise InputError(
            f"{field} contains a NUL byte (\\x00), which Postgres text cannot hold; it was refused",
            hint="remove the NUL bytes from the input",
        )


def strip_nul(text: str, field: str) -> str:
    """Generated text: strip NUL bytes (with a warning) and check the size."""
    if "\x00" in text:
        log.warning("%s contained %d NUL byte(s); stripped (Postgres text cannot hold them)", field, text.count("\0"))
        text = text.replace("\x00", "")
    check_size(text, field)
    return text


def generated_text(value: Any, field: str, allow_none: bool = False) -> str | None:
    """A model-generated text field: type-checked, NUL-stripped, size-checked."""
    if type(value) is str and len(value) * 4 <= MAX_TEXT_BYTES and "\x00" not in value:
        return value  # fast path: the common case in a training step
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise InputError(f"{field} must be a string, got {type(value).__name__}")
    return strip_nul(value, field)


def finite_or_none(value: Any, field: str) -> float | None:
    """A reward-like number: None, or a finite float (bool is refused)."""
    if type(value) is float and math.isfinite(value):
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{field} must be a number or None, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value):
        raise InputError(f"{field} must be finite, got {value!r}")
    return float(value)


def int_or_none(value: Any, field: str, minimum: int | None = None) -> int | None:
    """None, or an int (bool refused) not below `minimum`."""
    if type(value) is int and (minimum is None or value >= minimum):
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{field} must be an integer or None, got {type(value).__name__} ({value!r})")
    if minimum is not None and value < minimum:
        raise InputError(f"{field} must be >= {minimum}, got {value}")
    return value


def row_id(value: Any, field: str, hint: str | None = None) -> int:
    """A row id (`problems.id`, `runs.id`, ...): an integer from 1 to BIGINT_MAX, or InputError saying the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy integers are Integral too
        raise InputError(f"{field} must be an integer, got {type(value).__name__} ({value!r})", hint=hint)
    if not 1 <= value <= BIGINT_MAX:
        raise InputError(f"{field} {value} is out of range: ids are integers from 1 to {BIGINT_MAX}", hint=hint)
    return int(value)


def bool_or_none(value: Any, field: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise InputError(f"{field} must be true, false or None, got {type(value).__name__} ({value!r})")


def json_object(value: Any, field: str) -> dict[str, Any]:
    """A JSON object that jsonb can store: a dict of JSON values, no NUL bytes, no NaN."""
    if not isinstance(value, dict):
        raise InputError(f"{field} must be a JSON object (dict), got {type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(
            f"{field} is not JSON-serialisable: {exc}", hint="use str, int, float, bool, list, dict"
        ) from exc
    if "\\u0000" in text:
        raise InputError(f"{field} contains a NUL byte (\\x00), which Postgres jsonb cannot hold; it was refused")
    check_size(text, field)
    return value


_dims: dict[tuple[str, str, str], int | None] = {}


def column_dim(session: Session, table: str, column: str = "embedding") -> int | None:
    """The declared dimension of `table.column` (a pgvector column), read from pg_catalog once per database."""
    bind = session.get_bind()
    key = (bind.url.render_as_string(hide_password=True), table, column)
    if key not in _dims:
        typmod = session.scalar(sqlfiles.load("queries/vector_dim"), {"table": table, "column": column})
        _dims[key] = typmod if typmod is not None and typmod > 0 else None
    return _dims[key]


def vector_text(session: Session, embedding: Any, table: str, field: str) -> str | None:
    """An embedding as pgvector text `[a,b,...]`, its length checked against the column's dimension."""
    if embedding is None:
        return None
    try:
        values = [float(x) for x in embedding]
    except (TypeError, ValueError) as exc:
        raise InputError(f"{field} must be a sequence of numbers") from exc
    dim = column_dim(session, table)
    if dim is not None and len(values) != dim:
        raise InputError(
            f"{field} has {len(values)} dimensions but {table}.embedding is vector({dim})",
            hint=f"embed with a {dim}-d model, or create the store with LANPO_EMBEDDING_DIM={len(values)}",
        )
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"{field} contains NaN or infinity")
    return "[" + ",".join(repr(v) for v in values) + "]"
