"""lanpo's store inside verl (docs/verl.md): the `lanpo` agent loop, the agent loop manager whose workers write
each group back, and the checkpoint callback. Importing this package imports nothing of verl until one of those
names is used, so `lanpo.integrations.verl.store` and `.process` run without verl installed."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "LanpoAgentLoop": "loop",
    "LanpoAgentLoopManager": "manager",
    "LanpoAgentLoopWorker": "manager",
    "LanpoCheckpointCallback": "checkpoint",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
