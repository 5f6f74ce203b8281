"""The one line a training step prints (`lanpo train --no-progress`, and the demo's training stage)."""

from __future__ import annotations

import math

from lanpo.feedback_modes import PROMPT_MODES


def step_line(step: int, metrics: dict[str, float]) -> str:
    """Reward, accuracy (overall and by mode), KL, response length, pool size, MEL's yield and J_NLL, seconds."""
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
    return (
        f"step {step:>4}  reward {metrics['reward/mean']:.3f}  acc {metrics['accuracy/mean']:.2f} ({acc_by_mode})  "
        f"kl {kl:.2e}  len {metrics['response_len/mean']:.0f}  pool {metrics.get('pool/active', 0):.0f}  {mel}"
        f"{metrics['time/step']:.1f}s"
    )
