"""The progress a step line ends with (`lanpo train --no-progress`, the demo's stage 4): durations and the ETA."""

from __future__ import annotations

import math

import pytest

from lanpo.train.plumbing.step_line import StepClock, duration, eta_seconds, remaining, validation_line

METRICS = {"reward/mean": 0.5, "accuracy/mean": 0.25, "response_len/mean": 30.0, "kl": 0.0, "pool/active": 2.0}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (9.4, "9s"), (59.4, "59s"), (59.6, "1m00s"), (250, "4m10s"), (3599, "59m59s"), (3900, "1h05m"),
     (-3, "0s")],
)  # fmt: skip
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_eta_is_the_steps_to_go_times_the_mean_step_time() -> None:
    assert eta_seconds([40.0, 60.0], 2, 8) == 6 * 50.0
    assert eta_seconds([40.0], 8, 8) == 0.0
    assert math.isnan(eta_seconds([], 0, 8))
    assert remaining(3, 8, [50.0, 50.0, 50.0]) == "eta 4m10s"
    assert remaining(8, 8, [50.0]) == "done"
    assert remaining(0, 8, []) == "eta ?"


def test_the_clock_ends_each_step_line_with_the_time_left() -> None:
    """A resumed run starts at step 5 of 8: three steps to go after it, at the mean of the steps this call ran."""
    clock = StepClock(8)
    first = clock.line(5, METRICS | {"time/step": 40.0})
    assert first.startswith("step    5/8  reward 0.500  acc 0.25") and first.endswith("40.0s  eta 2m00s")
    assert clock.line(6, METRICS | {"time/step": 80.0}).endswith("80.0s  eta 2m00s")  # 2 x mean(40, 80)
    assert clock.line(8, METRICS | {"time/step": 60.0}).endswith("60.0s  done")


def test_validation_line() -> None:
    val = {"val/chain-test/mean@4": 0.25, "val/chain-test/pass@4": 0.5, "time/validate": 12.2}
    assert validation_line(0, val) == "held-out validation at step 0: chain-test/mean@4 0.250 (12s)"
