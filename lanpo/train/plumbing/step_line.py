"""The one line a training step prints (`lanpo train --no-progress`, and the demo's training stage), and the
progress that follows it: the step of how many, and the time left at the mean step time so far."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from lanpo.feedback_modes import PROMPT_MODES


def step_line(step: int, metrics: dict[str, float], steps: int | None = None) -> str:
    """Reward, accuracy (overall and by mode), KL, response length, pool size, MEL's yield and J_NLL, seconds;
    the step as `3/8` when the run's `steps` is given."""
    acc_by_mode = " ".join(
        f"{mode}={metrics[f'accuracy/{mode}']:.2f}" for mode in PROMPT_MODES if f"accuracy/{mode}" in metrics
    )
    kl = metrics.get("kl", math.nan)
    mel = ""
    if "mel/pairs" in metrics:  # MEL: pairs -> lessons -> validated, and J_NLL
        nll = f"{metrics['mel/nll']:.2f}" if "mel/nll" in metrics else "-"  # no validated lesson: no term
        mel = (
            f"mel {metrics['mel/pairs']:.0f}->{metrics['mel/candidates']:.0f}->{metrics['mel/validated']:.0f}"
            f" nll {nll}  "
        )
    which = f"{step:>4}" if steps is None else f"{step:>4}/{steps}"
    return (
        f"step {which}  reward {metrics['reward/mean']:.3f}  acc {metrics['accuracy/mean']:.2f} ({acc_by_mode})  "
        f"kl {kl:.2e}  len {metrics['response_len/mean']:.0f}  pool {metrics.get('pool/active', 0):.0f}  {mel}"
        f"{metrics['time/step']:.1f}s"
    )


def validation_line(step: int, metrics: dict[str, float]) -> str:
    """`held-out validation at step 0: chain_sum_easy-test/mean@4 0.250 (12s)`."""
    means = ", ".join(f"{name[4:]} {value:.3f}" for name, value in metrics.items() if re.match(r"val/.+/mean@", name))
    return f"held-out validation at step {step}: {means or '-'} ({duration(metrics.get('time/validate', 0.0))})"


def duration(seconds: float) -> str:
    """A wall time as a progress line shows it: `9s`, `4m10s`, `1h05m`."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def eta_seconds(step_seconds: Sequence[float], step: int, steps: int) -> float:
    """Seconds left after `step` of `steps`: the steps to go times the mean of the step times so far (validation,
    which runs on a few steps only, is not counted)."""
    if not step_seconds:
        return math.nan
    return max(steps - step, 0) * sum(step_seconds) / len(step_seconds)


def remaining(step: int, steps: int, step_seconds: Sequence[float]) -> str:
    """`eta 4m10s` after `step` of `steps` (`done` after the last; `eta ?` before any step time)."""
    if step >= steps:
        return "done"
    left = eta_seconds(step_seconds, step, steps)
    return "eta ?" if math.isnan(left) else f"eta {duration(left)}"


class StepClock:
    """The steps' times as they come: each step's line ends with the time left (`lanpo train --no-progress`, the
    demo)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.seconds: list[float] = []

    def line(self, step: int, metrics: dict[str, float]) -> str:
        """`step    3/8  reward ... 41.2s  eta 3m26s`."""
        self.seconds.append(metrics["time/step"])
        return f"{step_line(step, metrics, self.steps)}  {remaining(step, self.steps, self.seconds)}"
