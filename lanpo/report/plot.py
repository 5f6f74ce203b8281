"""Drawing: panels and lines in, a matplotlib Figure out; no pyplot, no display, no global state.

A `Figure` built directly renders with the Agg canvas when saved as PNG, so reports draw on a headless machine
and in threads. One colour per line (a run, or an arm), one line style per curve of a panel; a line over several
seeds is its mean with a shaded band (min–max or ±1 std); a single run's curve with a standard error (validation's
mean@k) has a band of ±1 SE. A panel of a bounded quantity (a share) keeps its y axis inside the bounds and spans at
least a tenth of them (`value_range`), so that noise is not magnified. Steps with a single point get markers, so that a
validation curve with two points (step 0 and the last step) still shows. A panel against a cost axis draws each
run's curve at its cumulative cost (an arm: its seeds interpolated onto one grid, `series.band_on_grid`), the axis
in the unit its largest value reads best in (tokens, thousands, millions; seconds, minutes, hours).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from lanpo.report.cost import Axis, against
from lanpo.report.figures import Curve, Panel
from lanpo.report.series import BAND_LABELS, Aggregate, Band, Line, Series, band, band_on_grid

MARKERS_UP_TO = 30  # points per curve below which every point gets a marker
MIN_SPAN = 0.1  # of a bounded panel's range: its y axis spans at least this share of it
STYLES = ("-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (10, 3)))  # one per curve of a panel; dotted: the reference


def curve_of(curve: Curve, line: Line, kind: Band, x: Axis | None = None) -> Aggregate | None:
    """The curve over the line's runs, against steps or the cost axis `x` (None when none of them recorded it)."""
    if x is None:
        found = [s for s in (curve.get(r) for r in line.runs) if s is not None and s.has_data()]
        return band(found, kind) if found else None
    points: list[tuple[np.ndarray, np.ndarray]] = []
    for run in line.runs:
        series = curve.get(run)
        pair = against(series, x.of(run)) if series is not None else None
        if pair is not None:
            points.append(pair)
    return band_on_grid(points, kind) if points else None


def error_band(curve: Curve, line: Line, x: Axis | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(x, mean - SE, mean + SE) of a single run's curve that has a standard error; None for an arm over seeds (its
    band is the seeds' spread) or a curve without one."""
    if curve.error is None or line.seeds != 1:
        return None
    run = line.runs[0]
    mean, error = curve.get(run), curve.error(run)
    if mean is None or error is None:
        return None
    common, im, ie = np.intersect1d(mean.steps, error.steps, return_indices=True)
    low, high = mean.values[im] - error.values[ie], mean.values[im] + error.values[ie]
    keep = np.isfinite(low) & np.isfinite(high)
    if not keep.any():
        return None
    if x is None:
        return common[keep].astype(float), low[keep], high[keep]
    cost = x.of(run)
    lows, highs = against(Series(common[keep], low[keep]), cost), against(Series(common[keep], high[keep]), cost)
    return None if lows is None or highs is None else (lows[0], lows[1], highs[1])


def value_range(
    low: float, high: float, bounds: tuple[float, float], min_share: float = MIN_SPAN
) -> tuple[float, float]:
    """The y range of a panel whose values lie in `bounds`: the drawn values [low, high] with a 5% margin, widened
    about their middle to at least `min_share` of the bounds, and moved inside them."""
    floor, ceiling = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        return bounds
    margin = 0.05 * (high - low)
    span = min(max(high - low + 2 * margin, min_share * (ceiling - floor)), ceiling - floor)
    middle = (low + high) / 2
    bottom = min(max(middle - span / 2, floor), ceiling - span)
    return bottom, bottom + span


def has_data(panel: Panel, lines: Sequence[Line]) -> bool:
    return any(curve_of(c, line, "minmax", panel.x) is not None for c in panel.curves for line in lines)


def draw(title: str, panels: Sequence[Panel], lines: Sequence[Line], kind: Band = "minmax") -> Figure:
    """One figure: a grid of `panels`, each line in its colour, its band shaded when it spans several seeds."""
    cols = 1 if len(panels) == 1 else 2 if len(panels) in (2, 4) else 3
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.8 * cols, 3.3 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        if panel.kind == "bars":
            _bars(ax, panel, lines, kind)
        else:
            _lines(ax, panel, lines, kind)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    banded = any(line.seeds > 1 for line in lines)
    note = f"(mean over seeds; band: {BAND_LABELS[kind]})"
    # one panel is 4.8 inches wide, too narrow for the title and the note on one line
    fig.suptitle(title + (("\n" if cols == 1 else "  ") + note if banded else ""), fontsize=11)
    handles = [Line2D([], [], color=_colour(i), linewidth=2) for i in range(len(lines))]
    labels = [f"{line.label} (n={line.seeds})" if line.seeds > 1 else line.label for line in lines]
    # as many columns as the widest label fits across the figure (~0.075 in a character at size 9, + the swatch)
    per_column = 0.075 * max((len(label) for label in labels), default=1) + 0.7
    ncols = max(1, min(len(lines), 4, int(4.8 * cols / per_column)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)
    return fig


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def _colour(index: int) -> str:
    return f"C{index % 10}"


def _lines(ax: Axes, panel: Panel, lines: Sequence[Line], kind: Band) -> None:
    drawn: set[int] = set()  # curves with data, for the legend of line styles
    curves = {
        (i, j): curve_of(c, line, kind, panel.x) for i, line in enumerate(lines) for j, c in enumerate(panel.curves)
    }
    largest = max((float(np.nanmax(a.x)) for a in curves.values() if a is not None and len(a.x)), default=0.0)
    divisor, xlabel = panel.x.unit(largest) if panel.x is not None else (1.0, "step")
    values: list[np.ndarray] = []  # every y drawn: lines, bands, reference levels (the bounded axis covers them)
    with_error = False
    for i, line in enumerate(lines):
        for j, curve in enumerate(panel.curves):
            agg = curves[(i, j)]
            if agg is None:
                continue
            drawn.add(j)
            # against a cost axis an arm's grid points are other seeds' x values, not its own measurements
            marked = panel.x is None or line.seeds == 1
            marker = "o" if marked and np.isfinite(agg.mean).sum() <= MARKERS_UP_TO else None
            style = STYLES[j % len(STYLES)]
            x = agg.x / divisor
            ax.plot(x, agg.mean, linestyle=style, color=_colour(i), marker=marker, markersize=3, linewidth=1.5)
            values.append(agg.mean)
            if line.seeds > 1:
                ax.fill_between(x, agg.low, agg.high, color=_colour(i), alpha=0.2, linewidth=0)
                values += [agg.low, agg.high]
            se = error_band(curve, line, panel.x)
            if se is not None:
                ax.fill_between(se[0] / divisor, se[1], se[2], color=_colour(i), alpha=0.2, linewidth=0)
                values += [se[1], se[2]]
                with_error = True
        level = _reference(panel, line)
        if level is not None:
            ax.axhline(level, color=_colour(i), linestyle=":", linewidth=1.2)
            values.append(np.array([level]))
    if panel.bounds is not None and values:
        every = np.concatenate(values)
        every = every[np.isfinite(every)]
        if len(every):
            ax.set_ylim(*value_range(float(every.min()), float(every.max()), panel.bounds))
    ax.set_xlabel(xlabel, fontsize=9)
    if panel.x is None:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    styled = sorted(drawn) if len(panel.curves) > 1 else []
    keys = [Line2D([], [], color="0.3", linestyle=STYLES[j % len(STYLES)]) for j in styled]
    names = [panel.curves[j].label for j in styled]
    if panel.reference is not None and any(_reference(panel, line) is not None for line in lines):
        keys.append(Line2D([], [], color="0.3", linestyle=":"))
        names.append(panel.reference_label)
    if with_error:
        keys.append(Patch(color="0.3", alpha=0.2, linewidth=0))
        names.append("±1 SE over problems")
    if keys:
        ax.legend(keys, names, fontsize=7, loc="best")


def _reference(panel: Panel, line: Line) -> float | None:
    if panel.reference is None:
        return None
    levels = [v for v in (panel.reference(r) for r in line.runs) if v is not None and math.isfinite(v)]
    return sum(levels) / len(levels) if levels else None


def _bars(ax: Axes, panel: Panel, lines: Sequence[Line], kind: Band) -> None:
    """One group of bars per curve (e.g. a phase): each line's mean over steps, then over seeds, with its band."""
    width = 0.8 / max(len(lines), 1)
    x = np.arange(len(panel.curves))
    for i, line in enumerate(lines):
        heights, low, high = [], [], []
        for curve in panel.curves:
            per_run = [float(np.nanmean(s.values)) for s in (curve.get(r) for r in line.runs) if s and s.has_data()]
            mean = float(np.mean(per_run)) if per_run else np.nan
            if kind == "std" and len(per_run) > 1:
                spread = float(np.std(per_run, ddof=1))
                lo, hi = mean - spread, mean + spread
            else:
                lo, hi = (min(per_run), max(per_run)) if per_run else (np.nan, np.nan)
            heights.append(mean)
            low.append(mean - lo)
            high.append(hi - mean)
        errors = np.clip(np.nan_to_num(np.array([low, high])), 0, None) if line.seeds > 1 else None  # (2, P)
        ax.bar(x + (i - (len(lines) - 1) / 2) * width, heights, width, yerr=errors, color=_colour(i), capsize=2)
    ax.set_xticks(x, [c.label for c in panel.curves], rotation=40, ha="right", fontsize=8)
