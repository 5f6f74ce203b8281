"""Bands over seeds and derived series: the vectorised versions against plain loops."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.report.figures import asked_share, served_share, total, val_average
from lanpo.report.series import RunData, RunInfo, Series, band, derived


def band_loop(series: list[Series], kind: str) -> dict[int, tuple[float, float, float]]:
    """step -> (mean, low, high) over the runs with a finite value there: the reference for `band`."""
    out = {}
    for step in sorted({int(x) for s in series for x in s.steps}):
        values = [v for s in series if (v := s.at(step)) is not None and math.isfinite(v)]
        if not values:
            out[step] = (math.nan, math.nan, math.nan)
            continue
        mean = statistics.fmean(values)
        if kind == "minmax":
            out[step] = (mean, min(values), max(values))
        else:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            out[step] = (mean, mean - spread, mean + spread)
    return out


values = st.one_of(st.floats(-5, 5, allow_nan=False), st.just(math.nan))
runs = st.lists(st.dictionaries(st.integers(0, 12), values, min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(runs, st.sampled_from(["minmax", "std"]))
def test_band_equals_the_loop(data: list[dict[int, float]], kind: str) -> None:
    series = [Series.of(list(d), list(d.values())) for d in data]
    agg = band(series, kind)  # type: ignore[arg-type]
    expected = band_loop(series, kind)
    assert agg.x.tolist() == list(expected)
    got = np.stack([agg.mean, agg.low, agg.high], axis=1)
    assert np.allclose(got, np.array(list(expected.values())).reshape(-1, 3), equal_nan=True, atol=1e-9)


def test_series_sorted_and_last_finite() -> None:
    s = Series.of([3, 1, 2], [math.nan, 0.1, None])
    assert s.steps.tolist() == [1, 2, 3] and s.last() == (1, 0.1) and s.at(2) is not None and s.at(7) is None
    assert not Series.of([1], [math.nan]).has_data()


def test_derived_on_common_steps() -> None:
    a, b = Series.of([1, 2, 3], [1.0, 2.0, 3.0]), Series.of([2, 3, 4], [0.0, 4.0, 1.0])
    ratio = derived(a, b, "div")
    assert ratio.steps.tolist() == [2, 3] and math.isnan(ratio.values[0]) and ratio.values[1] == 0.75
    with pytest.raises(ValueError):
        derived(a, b, "pow")


def run_with(metrics: dict[str, dict[int, float]], group_size: int | None = 2, mode: str = "both") -> RunData:
    info = RunInfo(1, "r", "train", "running", feedback_mode=mode, p_t=0.5, group_size=group_size)
    return RunData(info, {k: Series.of(list(v), list(v.values())) for k, v in metrics.items()})


def test_feedback_shares() -> None:
    """served = (intra + inter) / all rollouts; asked = asked prompts / (rollouts / n); a missing count is 0."""
    run = run_with(
        {
            "count/zero_shot": {1: 4.0, 2: 8.0},
            "count/intra": {1: 2.0, 2: 0.0},
            "count/inter": {1: 2.0},
            "feedback/asked/intra": {1: 3.0, 2: 2.0},
        }
    )
    assert served_share(run).values.tolist() == [0.5, 0.0]  # type: ignore[union-attr]
    assert asked_share(run).values.tolist() == [0.75, 0.5]  # type: ignore[union-attr]
    assert asked_share(run_with({"count/zero_shot": {1: 4.0}, "feedback/asked/intra": {1: 1.0}}, None)) is None
    assert total(run, ["nosuch"]) is None
    assert run_with({}, mode="none").run.asked_p_t == 0.0


def test_validation_average_on_steps_with_every_dataset() -> None:
    run = run_with({"val/a/mean@4": {0: 0.2, 5: 0.4, 10: 0.6}, "val/b/mean@2": {0: 0.0, 10: 0.2}})
    average = val_average({"a": 4, "b": 2})(run)
    assert average is not None and average.steps.tolist() == [0, 10]
    assert average.values.tolist() == pytest.approx([0.1, 0.4])
    assert val_average({"a": 4, "c": 4})(run) is None
