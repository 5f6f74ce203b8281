"""Files and folders a user names: checked before any work starts, and written so that a failure leaves nothing.

An output FILE needs an existing, writable folder (as a shell redirection does: a typo in the folder is an error,
not a new folder somewhere). An output FOLDER is created with its parents, so it must not be a file and its
nearest existing ancestor must be a writable folder. `atomic_write` writes beside the target and renames it
into place, so a failure half-way leaves the old file (or none), never half a new one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from lanpo.errors import InputError


def input_file(path: str | Path, what: str) -> Path:
    """`path` as an existing, readable file; InputError naming `what` (e.g. `--input`) otherwise."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{what} {path} does not exist", hint="check the path")
    if not path.is_file():
        raise InputError(f"{what} {path} is not a file", hint="name a file, not a folder")
    if not os.access(path, os.R_OK):
        raise InputError(f"{what} {path} is not readable", hint="check its permissions")
    return path


def output_file(path: str | Path, what: str) -> Path:
    """`path` as a file that can be written: not a folder, in an existing writable folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{what} {path} is a folder", hint="name a file to write")
    folder = path.parent
    if not folder.exists():
        raise InputError(
            f"{what} {path}: the folder {folder} does not exist", hint=f"create it first: mkdir -p {folder}"
        )
    if not folder.is_dir():
        raise InputError(f"{what} {path}: {folder} is not a folder", hint="check the path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{what} {path} cannot be written (permission denied)", hint="choose a writable location")
    return path


def output_dir(path: str | Path, what: str) -> Path:
    """`path` as a folder that exists or can be created (parents included) and written."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} is a file, not a folder", hint="name a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{what} {path}: {existing} is a file, not a folder", hint="check the path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(
            f"{what} {path} cannot be created or written (permission denied)", hint="choose a writable location"
        )
    return path


@contextmanager
def atomic_write(path: str | Path) -> Iterator[TextIO]:
    """A text handle whose content replaces `path` only when the block finishes without an exception."""
    with atomic_path(path) as staging, staging.open("w", encoding="utf-8") as handle:
        yield handle


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A staging path beside `path` for a writer that takes a path (a parquet writer): renamed onto `path` only
    when the block finishes without an exception, removed otherwise."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield staging
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
