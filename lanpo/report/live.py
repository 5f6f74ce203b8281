"""Live logging while a run trains, the ecosystem's usual way: `report_to = ["tensorboard", "wandb"]`.

The database stays the source of truth (`lanpo report` reads it); these are views for people who watch
TensorBoard or Weights & Biases. TensorBoard writes event files offline under `<out_dir>/tensorboard` through
torch's SummaryWriter (`pip install 'lanpo[report]'` brings the `tensorboard` package). wandb is used only when it
is installed and configured: WANDB_API_KEY set, a `wandb login` in ~/.netrc, or WANDB_MODE offline / disabled;
WANDB_PROJECT (default "lanpo") and WANDB_ENTITY choose where the run goes. Asking for a backend that cannot
work is a ConfigError naming the fix, raised when the logger is made, before any step runs. Call it on rank 0.

    logger = MetricsLogger(["tensorboard"], "my-run", Path("~/.lanpo/runs/my-run"), config=to_mapping(cfg))
    logger.log(step, metrics)   # each committed step
    logger.close()              # or use it as a context manager
"""

from __future__ import annotations

import math
import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from lanpo.errors import ConfigError

REPORT_TO = ("tensorboard", "wandb")
WANDB_HOST = "api.wandb.ai"
WANDB_QUIET_MODES = ("offline", "disabled", "dryrun")


def check_report_to(report_to: Sequence[str], key: str = "report_to") -> list[str]:
    """The backends asked for, in order, without repeats; ConfigError for an unknown one."""
    unknown = [name for name in report_to if name not in REPORT_TO]
    if unknown:
        raise ConfigError(
            f"{key} must name backends among {', '.join(REPORT_TO)}, got {', '.join(map(repr, unknown))}",
            hint=f'e.g. {key} = ["tensorboard"] (or [] for none: the database always has every metric)',
        )
    return list(dict.fromkeys(report_to))


class MetricsLogger:
    """Sends each step's metrics to the backends of `report_to` (an empty list: a logger that does nothing)."""

    def __init__(
        self,
        report_to: Sequence[str],
        run_name: str,
        out_dir: str | Path,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.report_to = check_report_to(report_to)
        self.log_dir = Path(out_dir).expanduser() / "tensorboard"
        self._tensorboard: Any = None
        self._wandb: Any = None
        if "tensorboard" in self.report_to:
            self._tensorboard = _summary_writer(self.log_dir)
        if "wandb" in self.report_to:
            wandb = _wandb_module()
            self._wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "lanpo"),
                name=run_name,
                config=dict(config or {}),
                dir=str(Path(out_dir).expanduser()),
            )

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None:
        """Log one step's numbers (None skipped; NaN kept, as the database keeps it)."""
        values = {k: float(v) for k, v in metrics.items() if v is not None and not isinstance(v, bool)}
        if self._tensorboard is not None:
            for name, value in values.items():
                self._tensorboard.add_scalar(name, value, global_step=step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in values.items() if not math.isinf(v)}, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _summary_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch's writer needs the tensorboard package
        raise ConfigError(
            'report_to includes "tensorboard", but the tensorboard package is not installed',
            hint="pip install 'lanpo[report]' (or pip install tensorboard), or drop it from report_to",
        ) from exc
    return SummaryWriter(log_dir=str(log_dir))


def wandb_configured(environ: Mapping[str, str] | None = None, netrc_path: Path | None = None) -> bool:
    """An API key in the environment or ~/.netrc, or a mode that needs none (offline, disabled)."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE", "").lower() in WANDB_QUIET_MODES:
        return True
    try:
        return netrc.netrc(str(netrc_path) if netrc_path else None).authenticators(WANDB_HOST) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _wandb_module() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ConfigError(
            'report_to includes "wandb", but wandb is not installed',
            hint="pip install wandb, or drop it from report_to (TensorBoard logs offline)",
        ) from exc
    if not wandb_configured():
        raise ConfigError(
            'report_to includes "wandb", but wandb is not configured',
            hint="set WANDB_API_KEY (or run `wandb login`), or WANDB_MODE=offline to log without an account",
        )
    return wandb
