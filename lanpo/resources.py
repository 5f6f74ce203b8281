"""Project folders lanpo reads at run time (`sql/`, `migrations/`, `train/configs/`).

In a source checkout they sit at the repository root; a wheel carries copies under `lanpo/_data/`
(`pyproject.toml`, force-include), named by the folder's last component.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def project_dir(relative: str, must_contain: str) -> Path | None:
    """`relative` (e.g. `train/configs`) holding `must_contain`, from the checkout or the wheel; None if absent."""
    for candidate in (_PACKAGE.parent / relative, _PACKAGE / "_data" / Path(relative).name):
        if (candidate / must_contain).exists():
            return candidate
    return None
