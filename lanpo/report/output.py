"""The report folder: checked before any work, written in a staging folder beside it, then moved into place whole.

A failure half-way leaves no trace: the staging folder is removed and the target is as it was (absent, or the
previous report). A folder that already holds a lanpo report (its report.md starts with `MARKER`) is replaced as
a whole, so no figure of an earlier report survives beside the new one; any other non-empty folder is refused.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lanpo.errors import InputError
from lanpo.paths import output_dir

MARKER = "<!-- lanpo report -->"


def is_report(folder: Path) -> bool:
    try:
        with (folder / "report.md").open(encoding="utf-8") as handle:
            return handle.readline().strip() == MARKER
    except (OSError, UnicodeDecodeError):
        return False


def check_out_dir(path: str | Path) -> Path:
    """`path` as a folder the report may be written to: new, empty, or a previous lanpo report."""
    path = output_dir(path, "--out").absolute()
    if path.exists() and any(path.iterdir()) and not is_report(path):
        raise InputError(
            f"--out {path} holds files that are not a lanpo report",
            hint="name a new or empty folder (a folder holding an earlier report is replaced)",
        )
    return path


@contextmanager
def staged(path: Path) -> Iterator[Path]:
    """A fresh staging folder to write into; on success it becomes `path` (replacing an earlier report)."""
    anchor = path.parent
    while not anchor.exists():
        anchor = anchor.parent
    staging = anchor / f".{path.name}.report-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        check_out_dir(path)  # still new, empty, or a report: nothing else appeared there meanwhile
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            previous = path.with_name(f".{path.name}.report-old-{os.getpid()}")
            os.replace(path, previous)
            os.replace(staging, path)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
