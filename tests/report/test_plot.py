"""The validation figure does not magnify noise: a band of +-1 SE around a single run, and a y axis of a sensible
range, read back from the matplotlib objects `plot.draw` builds; the use diagnostics' figure draws each mode."""

from __future__ import annotations

import numpy as np
import pytest

from lanpo.diagnostics import DIAGNOSED_MODES, DIAGNOSTICS
from lanpo.report import plot
from lanpo.report.cost import TOKENS, TOKENS_AXIS
from lanpo.report.figures import CATALOGUE, SHARE, USE_PANELS
from lanpo.report.series import Line, RunData, RunInfo, Series

VAL = "val/chain-test/mean@4"


def spec(name: str):  # type: ignore[no-untyped-def]
    return next(s for s in CATALOGUE if s.name == name)


def run(name: str, values: list[float], errors: list[float] | None = None) -> RunData:
    """A run validated at steps 0 and 4 (the demo's), with the standard errors the report read from its attempts."""
    steps = [0, 4]
    data = RunData(RunInfo(1, name, "train", "finished"), {VAL: Series.of(steps, values)})
    data.metrics[TOKENS] = Series.of([1, 2, 3, 4], [100.0] * 4)
    if errors is not None:
        data.errors[VAL] = Series.of(steps, errors)
    return data


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.25, 0.28, (0.215, 0.315)),  # a close pair: widened to a tenth of [0, 1] about its middle
        (0.0, 0.02, (0.0, 0.1)),  # kept inside the bounds
        (0.97, 1.0, (0.9, 1.0)),
        (0.2, 0.6, (0.18, 0.62)),  # wide enough: the values with a 5% margin
        (-0.1, 1.2, (0.0, 1.0)),
    ],
)
def test_value_range(low: float, high: float, expected: tuple[float, float]) -> None:
    assert plot.value_range(low, high, SHARE) == pytest.approx(expected)


def test_validation_of_one_run_has_an_se_band_and_a_range_no_narrower_than_it() -> None:
    """The demo's case: 0.25 -> 0.28 on 8 problems, SE 0.15: the axis covers the band, not only the two points."""
    data = run("demo", [0.25, 0.28], [0.15, 0.16])
    panels = spec("validation").panels([data])
    figure = plot.draw("Validation mean@k", panels, [Line("demo", [data])])
    ax = figure.axes[0]
    bottom, top = ax.get_ylim()
    assert 0.0 <= bottom <= 0.25 - 0.15 and 0.28 + 0.16 <= top <= 1.0
    (band,) = ax.collections  # one fill_between: mean +- SE at steps 0 and 4
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() == pytest.approx(0.10) and ys.max() == pytest.approx(0.44)
    assert "±1 SE over problems" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_validation_without_errors_still_spans_a_tenth() -> None:
    data = run("old", [0.25, 0.28])
    figure = plot.draw("Validation mean@k", spec("validation").panels([data]), [Line("old", [data])])
    ax = figure.axes[0]
    bottom, top = ax.get_ylim()
    assert top - bottom == pytest.approx(0.1) and bottom <= 0.25 and top >= 0.28
    assert not ax.collections and ax.get_legend() is None


def test_validation_against_tokens_has_the_band_too() -> None:
    """Against the cost axis the band sits at the cumulative tokens of steps 0 and 4, as the line does."""
    data = run("demo", [0.25, 0.28], [0.05, 0.05])
    panels = spec("validation_tokens").panels([data])
    figure = plot.draw("Validation against tokens", panels, [Line("demo", [data])])
    ax = figure.axes[0]
    (band,) = ax.collections
    xs = np.concatenate([p.vertices[:, 0] for p in band.get_paths()])
    divisor, _ = TOKENS_AXIS.unit(400.0)
    assert xs.min() == pytest.approx(0.0) and xs.max() == pytest.approx(400.0 / divisor)  # step 4: 4 x 100 tokens
    bottom, top = ax.get_ylim()
    assert bottom <= 0.20 and top >= 0.33 and top - bottom >= 0.1


def test_use_figure_draws_each_diagnostic_per_mode_with_zero_shot_as_reference() -> None:
    """One panel per diagnostic, a curve per mode with a context, read under the names rollout_metrics writes; a
    run without intra rollouts has no intra curve, and zero-shot is drawn in the answer-only panel alone."""
    recorded = {"use/answer_only/zero_shot": [0.1, 0.0], "use/echo/inter": [0.2, 0.4], "use/sections/inter": [1, 1]}
    recorded |= {"use/answer_only/inter": [0.5, 0.25], "use/answer_copied/inter": [0.0, 0.5]}
    data = RunData(RunInfo(1, "u", "train", "finished"), {n: Series.of([1, 2], v) for n, v in recorded.items()})
    panels = spec("use").panels([data])
    assert [p.title for p in panels] == list(USE_PANELS.values())
    assert list(USE_PANELS) == list(DIAGNOSTICS)
    assert panels[2].reads == tuple(f"use/answer_only/{m}" for m in ("zero_shot", *DIAGNOSED_MODES))
    assert all(p.bounds == SHARE and plot.has_data(p, [Line("u", [data])]) for p in panels)
    figure = plot.draw("use", panels, [Line("u", [data])])
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in figure.axes[:4]]
    assert legends == [["inter"], ["inter"], ["zero-shot", "inter"], ["inter"]]
    assert [len(ax.get_lines()) for ax in figure.axes[:4]] == [1, 1, 2, 1]
