"""What a run had paid by the end of each step: the x axes of the compute-matched figures and the table's cost.

Generated tokens: every token the step generated, `cost/generated_tokens` (lanpo.feedback.record.cost_metrics,
every rank's): the training rollouts' completions, the summariser's generations, MEL's diagnoses and replays
(`cost/generated_tokens/<source>` breaks it down). Prompt tokens, counted apart on their own axis:
`cost/prompt_tokens`, the prompt tokens each of those generations read (a prompt once per sample drawn from it).
Older runs, step by step where the new metric is missing (and said so in report.md):
- generated: `tokens/completion`, the training rollouts' completions only (summaries and MEL were not counted, so
  the cost of a LANPO or MEL arm is understated there); before that metric, `response_len/mean` x the step's
  rollouts (the sum of `count/<mode>`), the same sum;
- prompt: `tokens/prompt`, the training rollouts' prompts only.
Trained tokens, on their own axis: `cost/trained_tokens`, the completion tokens the step's update batch held, the
fresh rollouts' and, with `[replay]`, the replayed rows' (a replayed row generates nothing: it costs its share of the
update, never a generated token); a run without it (no replay): its rollouts' completions, `tokens/completion`.
Not counted: validation (a measurement, the same protocol for every arm, not training; it records its own
`cost/validation/*`).

Training seconds: the sum of `time/step`, the wall seconds of each committed step from drawing its contexts to
writing its rows (generation, reward, summaries, MEL, reference log-probs, update, checkpoint, gather and the
rows' write). Not counted: validation (`time/validate`, kept out of `time/step` by the trainer), start-up (loading
the models and the store) and the work of a step lost to a crash (its metrics never commit).

Both are cumulative over steps 1..s, and 0 at step 0 (before any update). A step without its cost leaves the cost
unknown from there on (NaN): the points after it are left out rather than drawn at a cost too small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lanpo.feedback_modes import PROMPT_MODES
from lanpo.report.series import RunData, Series, derived, total

GENERATED = "cost/generated_tokens"  # every generated token of the step (rollouts, summaries, MEL)
PROMPTS = "cost/prompt_tokens"  # every prompt token those generations read
TRAINED = "cost/trained_tokens"  # completion tokens in the update's batch: fresh rollouts and replayed rows
TOKENS = "tokens/completion"  # the training rollouts' completions only (older runs' axis)
PROMPT_TOKENS = "tokens/prompt"
SECONDS = "time/step"
MEAN_LENGTH = "response_len/mean"


@dataclass(frozen=True)
class PerStep:
    """One run's cost of each training step (None: no step recorded it)."""

    series: Series | None
    derived: tuple[int, ...] = ()  # steps whose tokens are response_len/mean x rollouts (no tokens/completion)
    rollouts_only: tuple[int, ...] = ()  # steps without cost/*: the training rollouts' tokens only (older runs)


def completion_tokens(run: RunData) -> PerStep:
    """Completion tokens of each step's training rollouts: `tokens/completion`, else response_len/mean x rollouts."""
    recorded = _finite(run.metrics.get(TOKENS))
    mean, rollouts = run.metrics.get(MEAN_LENGTH), total(run, [f"count/{m}" for m in PROMPT_MODES])
    fallback = _finite(None if mean is None or rollouts is None else derived(mean, rollouts, "mul"))
    if fallback is not None and recorded is not None:  # the recorded sum wins where there is one
        fallback = _finite(
            Series(fallback.steps, np.where(np.isin(fallback.steps, recorded.steps), np.nan, fallback.values))
        )
    if fallback is None:
        return PerStep(recorded)
    fallback = Series(fallback.steps, np.rint(fallback.values))  # a mean of integers times their count
    parts = [fallback] if recorded is None else [recorded, fallback]
    merged = Series.of(
        np.concatenate([p.steps for p in parts]).tolist(), np.concatenate([p.values for p in parts]).tolist()
    )
    return PerStep(merged, tuple(int(x) for x in fallback.steps))


def generated_tokens(run: RunData) -> PerStep:
    """Every token each step generated: `cost/generated_tokens`, else the rollouts' own (`completion_tokens`)."""
    return _preferred(_finite(run.metrics.get(GENERATED)), completion_tokens(run))


def prompt_tokens(run: RunData) -> PerStep:
    """Every prompt token each step's generations read: `cost/prompt_tokens`, else the rollouts' (`tokens/prompt`)."""
    return _preferred(_finite(run.metrics.get(PROMPTS)), PerStep(_finite(run.metrics.get(PROMPT_TOKENS))))


def _preferred(full: Series | None, older: PerStep) -> PerStep:
    """`full` on the steps it has; `older` (rollouts only) on the others, named in `rollouts_only`."""
    if older.series is None:
        return PerStep(full)
    keep = ~np.isin(older.series.steps, full.steps) if full is not None else np.ones(len(older.series.steps), bool)
    steps, values = older.series.steps[keep], older.series.values[keep]
    if full is not None:
        steps, values = np.concatenate([full.steps, steps]), np.concatenate([full.values, values])
    order = np.argsort(steps, kind="stable")
    derived = tuple(x for x in older.derived if x in set(older.series.steps[keep].tolist()))
    rollouts_only = tuple(int(x) for x in older.series.steps[keep])
    return PerStep(Series(steps[order], values[order]), derived, rollouts_only)


def trained_tokens(run: RunData) -> PerStep:
    """Completion tokens of each step's update batch: `cost/trained_tokens`, else the rollouts' own."""
    return _preferred(_finite(run.metrics.get(TRAINED)), completion_tokens(run))


def step_seconds(run: RunData) -> PerStep:
    """Wall seconds of each committed training step (`time/step`)."""
    return PerStep(_finite(run.metrics.get(SECONDS)))


def cumulative(run: RunData, per_step: PerStep) -> Series | None:
    """The cost up to and including each step 0..S (S: the run's last step with any metric), 0 at step 0.

    NaN from the first step 1..S without a cost on; None when no training step recorded one. A run with no
    training step yet is at 0 at step 0 only.
    """
    last = max((int(s.steps.max()) for s in run.metrics.values() if len(s.steps)), default=0)
    if last < 1:
        return Series.of([0], [0.0])
    if per_step.series is None:
        return None
    steps = np.arange(0, last + 1)  # (S+1,)
    cost = np.full(last + 1, np.nan)
    cost[0] = 0.0
    inside = (per_step.series.steps >= 1) & (per_step.series.steps <= last)
    cost[per_step.series.steps[inside]] = per_step.series.values[inside]
    return Series(steps, np.cumsum(cost))  # NaN propagates: unknown from the first step without a cost


def first_gap(run: RunData, per_step: PerStep) -> int | None:
    """The first training step without a cost (None: every step has one, or none has)."""
    cost = cumulative(run, per_step)
    if cost is None:
        return None
    missing = np.nonzero(~np.isfinite(cost.values))[0]
    return int(cost.steps[missing[0]]) if len(missing) else None


@dataclass(frozen=True)
class Axis:
    """A cost axis the validation figures are drawn against."""

    name: str  # tokens | time: the figure is validation_<name>.png
    what: str  # how report.md names it
    reads: tuple[str, ...]  # the metrics it is made of
    per_step: Callable[[RunData], PerStep]
    units: tuple[tuple[float, str], ...]  # (divisor, x label), small to large: the plot takes the largest that fits

    def of(self, run: RunData) -> Series | None:
        """The run's cumulative cost at each step (None: not recorded by the run)."""
        return cumulative(run, self.per_step(run))

    def unit(self, largest: float) -> tuple[float, str]:
        """The (divisor, label) that shows `largest` as at least 2 of a unit."""
        fitting = [u for u in self.units if largest >= 2 * u[0]]
        return fitting[-1] if fitting else self.units[0]


TOKENS_AXIS = Axis(
    "tokens",
    "generated tokens",
    (GENERATED, TOKENS),
    generated_tokens,
    (
        (1.0, "generated tokens"),
        (1e3, "generated tokens (thousands)"),
        (1e6, "generated tokens (millions)"),
        (1e9, "generated tokens (billions)"),
    ),
)
PROMPT_AXIS = Axis(
    "prompt_tokens",
    "prompt tokens",
    (PROMPTS, PROMPT_TOKENS),
    prompt_tokens,
    (
        (1.0, "prompt tokens"),
        (1e3, "prompt tokens (thousands)"),
        (1e6, "prompt tokens (millions)"),
        (1e9, "prompt tokens (billions)"),
    ),
)
TRAINED_AXIS = Axis(
    "trained_tokens",
    "trained tokens",
    (TRAINED, TOKENS),
    trained_tokens,
    (
        (1.0, "trained tokens"),
        (1e3, "trained tokens (thousands)"),
        (1e6, "trained tokens (millions)"),
        (1e9, "trained tokens (billions)"),
    ),
)
SECONDS_AXIS = Axis(
    "time",
    "training seconds",
    (SECONDS,),
    step_seconds,
    ((1.0, "training seconds"), (60.0, "training minutes"), (3600.0, "training hours")),
)


def against(y: Series, x: Series | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(x, y) on the steps where both are finite, in step order; None when there are none."""
    if x is None:
        return None
    _, iy, ix = np.intersect1d(y.steps, x.steps, return_indices=True)
    xs, ys = x.values[ix], y.values[iy]
    keep = np.isfinite(xs) & np.isfinite(ys)
    return (xs[keep], ys[keep]) if keep.any() else None


def notes(run: RunData) -> list[str]:
    """What report.md says of a run's cost: tokens derived from an older run's metrics, costs not recorded."""
    out = []
    for axis in (TOKENS_AXIS, PROMPT_AXIS, SECONDS_AXIS):
        per_step = axis.per_step(run)
        figure = f"validation_{axis.name}.png" if axis is not PROMPT_AXIS else "the table's prompt tokens column"
        if cumulative(run, per_step) is None:
            if axis is PROMPT_AXIS and cumulative(run, TOKENS_AXIS.per_step(run)) is None:
                continue  # said once, for generated tokens
            where = figure if axis is PROMPT_AXIS else f"{figure} and the table's {axis.what} column"
            out.append(
                f"{axis.what} not recorded by this run (no {' or '.join(_sources(axis))}): it is left out of {where}"
            )
            continue
        if per_step.rollouts_only:
            full, older = (GENERATED, TOKENS) if axis is TOKENS_AXIS else (PROMPTS, PROMPT_TOKENS)
            steps = per_step.rollouts_only
            out.append(
                f"{full} not recorded at {len(steps)} step(s) (from step {steps[0]}): their {axis.what} are the "
                f"training rollouts' only ({older}; summaries and MEL not counted), so this run's cost is understated "
                "there"
            )
        if per_step.derived:
            out.append(
                f"{TOKENS} not recorded at {len(per_step.derived)} step(s) (from step {per_step.derived[0]}): their "
                f"generated tokens are {MEAN_LENGTH} x the step's rollouts (count/<mode>), the same sum"
            )
        gap = first_gap(run, per_step)
        if gap is not None:
            out.append(
                f"{axis.what} not recorded at step {gap}: its cost from step {gap} on is unknown, so those "
                f"validations are left out of {figure}"
            )
    return out


def _sources(axis: Axis) -> list[str]:
    if axis is TOKENS_AXIS:
        return [GENERATED, TOKENS, f"{MEAN_LENGTH} with count/<mode>"]
    return [PROMPTS, PROMPT_TOKENS] if axis is PROMPT_AXIS else [SECONDS]


def _finite(series: Series | None) -> Series | None:
    if series is None:
        return None
    keep = np.isfinite(series.values)
    return Series(series.steps[keep], series.values[keep]) if keep.any() else None
