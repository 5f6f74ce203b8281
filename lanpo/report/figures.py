"""The figure catalogue: which `run_metrics` names each figure of a report draws, panel by panel.

A figure is a list of panels; a panel holds curves, each read from one run's metrics (a metric as recorded, or
derived from several, like the share of rollouts that were served feedback). Panels whose curves have no data in
any run are left out and named in report.md; a figure left without panels is not drawn. Figures whose panels
depend on what was recorded (validation datasets, MEL, missed-feedback reasons) discover the names. A panel is drawn
against steps, or against a cost axis (`lanpo.report.cost`: cumulative generated tokens, training seconds).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from lanpo.diagnostics import DIAGNOSED_MODES
from lanpo.feedback_modes import CONTEXT_MODES, MODES, PROMPT_MODES
from lanpo.report.cost import GENERATED, PROMPT_TOKENS, PROMPTS, SECONDS_AXIS, TOKENS, TOKENS_AXIS, TRAINED, Axis
from lanpo.report.series import RunData, Series, derived, total

Getter = Callable[[RunData], Series | None]

PHASES = (
    "context",
    "generate",
    "reward",
    "summarize",
    "prepare",
    "sleep",
    "ref_logp",
    "update",
    "gather",
    "checkpoint",
)
PHASES_LAST = ("db_write",)
NOT_PHASES = ("step", "cpu_step", "pool_share", "validate")  # time/* metrics that are not a phase of the step
VAL_MEAN = re.compile(r"^val/(?P<dataset>.+)/mean@(?P<k>\d+)$")


SHARE = (0.0, 1.0)  # the values a share (accuracy, mean@k, pass@k) can take


@dataclass(frozen=True)
class Curve:
    get: Getter
    reads: tuple[str, ...]  # the metric names it is made of (what report.md says is missing)
    label: str = ""  # legend entry when a panel holds several curves (drawn solid, dashed, dash-dotted, ...)
    error: Getter | None = None  # its standard error per step: a band of +-1 SE around a single run's line


@dataclass(frozen=True)
class Panel:
    title: str
    curves: tuple[Curve, ...]
    ylabel: str = ""
    kind: str = "line"  # line: value per step | bars: one bar per curve, its mean over steps
    reference: Callable[[RunData], float | None] | None = None  # a dotted level per line, e.g. the p_t asked for
    reference_label: str = ""
    x: Axis | None = None  # None: against steps; else a cost axis (cumulative generated tokens, training seconds)
    # the values its curves can take (SHARE for a share): the y axis stays inside them and spans at least a tenth
    # of them, so that noise between two close values is not drawn as a trend
    bounds: tuple[float, float] | None = None

    @property
    def reads(self) -> tuple[str, ...]:
        axis = self.x.reads if self.x is not None else ()
        return tuple(dict.fromkeys([*(name for c in self.curves for name in c.reads), *axis]))


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file stem: <name>.png
    title: str
    about: str  # one line in report.md: what it shows and from which metrics
    panels: Callable[[Sequence[RunData]], list[Panel]]
    pattern: str  # the metric names it draws, for "not recorded by this run"


def metric(name: str, label: str = "") -> Curve:
    return Curve(lambda run: run.metrics.get(name), (name,), label)


def single(title: str, name: str, ylabel: str = "", bounds: tuple[float, float] | None = None) -> Panel:
    return Panel(title, (metric(name),), ylabel, bounds=bounds)


def recorded_error(name: str) -> Getter:
    """The standard error the report read for metric `name` (validation's mean@k: over the held-out problems)."""
    return lambda run: run.errors.get(name)


def served_share(run: RunData) -> Series | None:
    """Share of the step's rollouts that carried a feedback context (count/<mode> are rollouts actually served)."""
    served, every = total(run, [f"count/{m}" for m in CONTEXT_MODES]), total(run, [f"count/{m}" for m in PROMPT_MODES])
    return None if served is None or every is None else derived(served, every, "div")


def asked_share(run: RunData) -> Series | None:
    """Share of the step's prompts that asked for feedback: feedback/asked/* over rollouts / group size."""
    asked, every = (
        total(run, [f"feedback/asked/{m}" for m in CONTEXT_MODES]),
        total(run, [f"count/{m}" for m in PROMPT_MODES]),
    )
    n = run.run.group_size
    if asked is None or every is None or not n:
        return None
    return derived(asked, Series(every.steps, every.values / n), "div")


def served_per_asked(mode: str) -> Curve:
    def get(run: RunData) -> Series | None:
        served, asked = run.metrics.get(f"feedback/served/{mode}"), run.metrics.get(f"feedback/asked/{mode}")
        return None if served is None or asked is None else derived(served, asked, "div")

    return Curve(get, (f"feedback/served/{mode}", f"feedback/asked/{mode}"), mode)


def names_matching(runs: Sequence[RunData], prefix: str) -> list[str]:
    return sorted({name for r in runs for name in r.metrics if name.startswith(prefix)})


def validation_keys(runs: Sequence[RunData]) -> dict[str, int]:
    """dataset -> k of its mean@k (the largest k recorded when there are several)."""
    out: dict[str, int] = {}
    for name in names_matching(runs, "val/"):
        match = VAL_MEAN.match(name)
        if match:
            out[match["dataset"]] = max(out.get(match["dataset"], 0), int(match["k"]))
    return dict(sorted(out.items()))


def val_average(keys: dict[str, int], of: str = "metrics") -> Getter:
    """Per run: the unweighted mean over datasets of mean@k, on the steps every dataset was validated; `of` =
    "errors": its standard error, sqrt(sum of the datasets' squared errors) / datasets (independent problems)."""

    def get(run: RunData) -> Series | None:
        table = run.metrics if of == "metrics" else run.errors
        found = [table.get(f"val/{d}/mean@{k}") for d, k in keys.items()]
        series = [s for s in found if s is not None]
        if not series or len(series) < len(found):
            return None
        steps = sorted(set.intersection(*(set(s.steps.tolist()) for s in series)))
        values = np.array([[s.values[s.steps == x][-1] for x in steps] for s in series])  # (datasets, steps)
        combined = values.mean(axis=0) if of == "metrics" else np.sqrt((values**2).sum(axis=0)) / len(series)
        return Series.of(steps, combined.tolist())

    return get


def val_mean(dataset: str, k: int) -> Curve:
    """A dataset's validation mean@k, with its standard error over the held-out problems."""
    name = f"val/{dataset}/mean@{k}"
    return Curve(metric(name).get, (name,), error=recorded_error(name))


def _validation(runs: Sequence[RunData]) -> list[Panel]:
    keys = validation_keys(runs)
    panels = [Panel(f"{d}: mean@{k}", (val_mean(d, k),), "mean@k", bounds=SHARE) for d, k in keys.items()]
    if len(keys) > 1:
        reads = tuple(f"val/{d}/mean@{k}" for d, k in keys.items())
        average = Curve(val_average(keys), reads, error=val_average(keys, "errors"))
        panels.append(Panel("average over datasets", (average,), "mean@k", bounds=SHARE))
    return panels


def _validation_against(axis: Axis) -> Callable[[Sequence[RunData]], list[Panel]]:
    """The validation figure's panels, drawn against a cost axis instead of steps."""
    return lambda runs: [replace(p, x=axis) for p in _validation(runs)]


def _validation_detail(runs: Sequence[RunData]) -> list[Panel]:
    names = names_matching(runs, "val/")
    passes = [n for n in names if re.match(r"^val/.+/pass@\d+$", n)]
    boxed = [n for n in names if n.endswith("/boxed")]
    return [single(n.removeprefix("val/").replace("/", ": "), n, bounds=SHARE) for n in passes + boxed]


def _feedback(runs: Sequence[RunData]) -> list[Panel]:
    share = Panel(
        "feedback share: served vs asked",
        (
            Curve(served_share, tuple(f"count/{m}" for m in PROMPT_MODES), "served (rollouts)"),
            Curve(asked_share, tuple(f"feedback/asked/{m}" for m in CONTEXT_MODES), "asked (prompts)"),
        ),
        "share",
        reference=lambda run: run.run.asked_p_t,
        reference_label="p_t asked for",
    )
    per_mode = Panel("served per asked, by mode", tuple(served_per_asked(m) for m in CONTEXT_MODES), "share")
    missed = [
        Curve(metric(n).get, (n,), n.removeprefix("feedback/missed/"))
        for n in names_matching(runs, "feedback/missed/")
    ]
    fitted = [
        Curve(metric(n).get, (n,), n.removeprefix("feedback/").replace("/", " "))
        for n in names_matching(runs, "feedback/items/") + names_matching(runs, "feedback/truncated/")
    ]  # how many of its k items a served prompt kept, and whether any was cut to fit rollout.max_prompt_tokens
    return (
        [share, per_mode]
        + ([Panel("missed contexts, by reason", tuple(missed), "prompts")] if missed else [])
        + ([Panel("served prompts: items kept, items cut", tuple(fitted), "rollouts")] if fitted else [])
    )


# the title of each use diagnostic's panel (lanpo.diagnostics.DIAGNOSTICS; metrics use/<diagnostic>/<mode>)
USE_PANELS = {
    "sections": "followed the prompt's sections",
    "echo": "echo: share of the context's 5-word shingles",
    "answer_only": "answer-only replies (zero-shot: reference)",
    "answer_copied": "final answer copied from a context item",
}


def _use(runs: Sequence[RunData]) -> list[Panel]:
    """One panel per use diagnostic, a curve per mode with a context (and zero-shot's answer-only rate)."""
    panels = []
    for diagnostic, title in USE_PANELS.items():
        modes = (("zero_shot",) if diagnostic == "answer_only" else ()) + DIAGNOSED_MODES
        curves = tuple(metric(f"use/{diagnostic}/{m}", MODES[m].title) for m in modes)
        panels.append(Panel(title, curves, "share", bounds=SHARE))
    return panels


def _time(runs: Sequence[RunData]) -> list[Panel]:
    recorded = {n.removeprefix("time/") for n in names_matching(runs, "time/")} - set(NOT_PHASES)
    order = [p for p in PHASES if p in recorded] + sorted(recorded - set(PHASES) - set(PHASES_LAST))
    order += [p for p in PHASES_LAST if p in recorded]
    phases = Panel("mean seconds per phase", tuple(metric(f"time/{p}", p) for p in order), "seconds", kind="bars")
    step = Panel(
        "seconds per step",
        (metric("time/step", "wall"), metric("time/cpu_step", "CPU"), metric("time/validate", "validation")),
        "seconds",
    )  # validation is not part of the step's wall time: its own curve, on the steps it ran
    return [phases, step, single("pool's share of the step", "time/pool_share", "share")]


def _each(prefix: str) -> Callable[[Sequence[RunData]], list[Panel]]:
    return lambda runs: [single(n.removeprefix(prefix), n) for n in names_matching(runs, prefix)]


def _by_mode(what: str, bounds: tuple[float, float] | None = None) -> Callable[[Sequence[RunData]], list[Panel]]:
    """`what` over every mode and per prompt mode; an opt-in mode (Fig. 2b's leaked one) only where a run recorded
    it (its arm's runs alone do: a panel every other report would list as left out)."""

    def panels(runs: Sequence[RunData]) -> list[Panel]:
        modes = [m for m in PROMPT_MODES if not MODES[m].opt_in or any(f"{what}/{m}" in r.metrics for r in runs)]
        return [single("all modes", f"{what}/mean", what, bounds)] + [
            single(MODES[m].title, f"{what}/{m}", what, bounds) for m in modes
        ]

    return panels


def _by_source(total_name: str) -> tuple[Curve, ...]:
    """Each source's part of the step's `total_name` (lanpo.feedback.record.COST_SOURCES)."""
    return tuple(metric(f"{total_name}/{s}", s) for s in ("rollout", "summary", "mel_diagnosis", "mel_replay"))


def _fixed(*panels: Panel) -> Callable[[Sequence[RunData]], list[Panel]]:
    return lambda runs: list(panels)


CATALOGUE: tuple[FigureSpec, ...] = (
    FigureSpec(
        "reward",
        "Reward per step",
        "mean reward of the step's rollouts, overall and by mode",
        _by_mode("reward"),
        "reward/mean, reward/<mode>",
    ),
    FigureSpec(
        "accuracy",
        "Accuracy per step",
        "share of correct rollouts, overall and by mode",
        _by_mode("accuracy", SHARE),
        "accuracy/mean, accuracy/<mode>",
    ),
    FigureSpec(
        "validation",
        "Validation mean@k",
        "held-out mean@k per dataset (step 0: before any update); the band around a single run's line is +-1 standard "
        "error over the held-out problems (from its stored val attempts), an arm's is its spread over seeds; the y "
        "axis spans at least 0.1",
        _validation,
        "val/<dataset>/mean@<k>",
    ),
    FigureSpec(
        "validation_tokens",
        "Validation mean@k against generated tokens",
        "held-out mean@k per dataset against every token the run generated up to and including the step: its "
        f"training rollouts, summaries, MEL's diagnoses and replays ({GENERATED}; a step recorded before it: its "
        f"rollouts' alone, {TOKENS}, said in the notes above; prompt tokens counted apart, validation not counted). "
        "Step 0 is at 0 tokens. An arm over seeds: each seed's curve interpolated linearly "
        "between its own validations onto one grid, its mean and band over every seed, from 0 to where its shortest "
        "seed ends",
        _validation_against(TOKENS_AXIS),
        f"val/<dataset>/mean@<k> with {GENERATED} (or {TOKENS}, or response_len/mean and count/<mode>)",
    ),
    FigureSpec(
        "validation_time",
        "Validation mean@k against training time",
        "held-out mean@k per dataset against the wall seconds of training up to and including the step: the sum of "
        "time/step, every phase of each committed step (generation, summaries, MEL, update, checkpoint, the rows' "
        "write); validation, start-up and work lost to a crash not counted. Step 0 is at 0 seconds. An arm over "
        "seeds: as for tokens, interpolated onto one grid up to where its shortest seed ends",
        _validation_against(SECONDS_AXIS),
        "val/<dataset>/mean@<k> with time/step",
    ),
    FigureSpec(
        "validation_detail",
        "Validation pass@k and boxed answers",
        "held-out pass@k and boxed-answer rate",
        _validation_detail,
        "val/<dataset>/pass@<k>, val/<dataset>/boxed",
    ),
    FigureSpec(
        "response_length",
        "Response length",
        "completion tokens, truncated share, feedback-format share, the step's completion and prompt tokens (every "
        "rollout's own prompt: the tokens the update reads besides its completion), and every token the step "
        "generated and read, by source (cost/*: rollouts, summaries, MEL's diagnoses and replays)",
        _fixed(
            single("mean response length", "response_len/mean", "tokens"),
            single("truncated at max_new_tokens", "response_len/truncated", "share"),
            single("in the feedback mode's format", "format/headers", "share"),
            Panel(
                "tokens per step",
                (
                    metric(TOKENS, "rollouts: completion"),
                    metric(PROMPT_TOKENS, "rollouts: prompt"),
                    metric(GENERATED, "every generation: generated"),
                    metric(PROMPTS, "every generation: prompt"),
                ),
                "tokens",
            ),
            Panel("generated tokens per step, by source", _by_source(GENERATED), "tokens"),
            Panel("prompt tokens per step, by source", _by_source(PROMPTS), "tokens"),
            Panel(
                "validation's tokens (on no cost axis)",
                (
                    metric("cost/validation/generated_tokens", "generated"),
                    metric("cost/validation/prompt_tokens", "prompt"),
                ),
                "tokens",
            ),
        ),
        f"response_len/mean, response_len/truncated, format/headers, {TOKENS}, {PROMPT_TOKENS}, {GENERATED}/*, "
        f"{PROMPTS}/*, cost/validation/*",
    ),
    FigureSpec(
        "policy",
        "KL, entropy and clip fraction",
        "k3 KL to the reference, token entropy, clipped share",
        _fixed(
            single("KL to reference", "kl"),
            single("entropy", "entropy"),
            single("clip fraction", "clip_frac"),
            single("dual-clip fraction", "dual_clip_frac"),
            single("TIS weight", "tis/weight"),
        ),
        "kl, entropy, clip_frac, dual_clip_frac, tis/weight",
    ),
    FigureSpec(
        "optimizer",
        "Loss and optimiser",
        "loss, gradient norm, learning rate, zero-spread share, and whether the update ran under bf16 autocast",
        _fixed(
            single("loss", "loss"),
            single("grad norm", "grad_norm"),
            single("learning rate", "lr"),
            single("rollouts with zero advantage", "groups/zero_spread", "share"),
            single("update under bf16 autocast (grpo.autocast)", "autocast/bf16", "1 = bf16, 0 = fp32"),
        ),
        "loss, grad_norm, lr, groups/zero_spread, autocast/bf16",
    ),
    FigureSpec(
        "feedback",
        "Feedback served against p_t",
        "share of rollouts served a context vs the p_t asked for",
        _feedback,
        "count/<mode>, feedback/asked|served/<mode>, feedback/missed/<reason>, feedback/items/*, feedback/truncated/*",
    ),
    FigureSpec(
        "use",
        "Do the answers use their context",
        "per mode with a context, the share of rollouts in the prompt's sections, the mean share of the context's "
        "5-word shingles the answer repeats, the share of answer-only replies (zero-shot's, the reference) and of "
        "final answers copied from a context item (lanpo.diagnostics; docs/concepts.md says what each can tell)",
        _use,
        "use/<diagnostic>/<mode>",
    ),
    FigureSpec(
        "pool",
        "Experience pool",
        "active experiences, added, merged into a lesson they repeat, dropped as duplicates, evicted and expired "
        "per step, summaries written",
        _fixed(
            single("active", "pool/active", "experiences"),
            single("added", "pool/added", "per step"),
            Panel(
                "merged and left",
                (
                    metric("pool/merged", "merged (a new version)"),
                    metric("pool/duplicates", "duplicates (nothing new)"),
                    metric("pool/evicted", "evicted by a cap"),
                    metric("pool/expired", "expired by policy age"),
                ),
                "per step",
            ),
            single("summaries", "pool/summaries", "per step"),
            single("summaries with the lesson's three parts", "summary/format", "share"),
            Panel(
                "summaries generated and refused",
                (
                    metric("summary/generated", "generated"),
                    metric("summary/rejected/format", "refused: format"),
                    metric("summary/rejected/short", "refused: short"),
                    metric("summary/rejected/repeats", "refused: repeats the problem's numbers"),
                    metric("summary/rejected/loop", "refused: a repetition loop"),
                    metric("summary/rejected/copied", "refused: copies the template or a section"),
                    metric("summary/rejected/restates", "refused: restates the question"),
                ),
                "per step",
            ),
        ),
        "pool/active, pool/added, pool/merged, pool/duplicates, pool/evicted, pool/expired, pool/summaries, "
        "summary/format, summary/generated, summary/rejected/*",
    ),
    FigureSpec(
        "time",
        "Seconds per phase",
        "wall seconds of each phase of a step (mean over steps)",
        _time,
        "time/<phase>, time/step, time/cpu_step, time/validate, time/pool_share",
    ),
    FigureSpec("mel", "Meta-experience learning", "MEL pairs, validation, replay and NLL", _each("mel/"), "mel/*"),
    FigureSpec("engine", "Rollout engine", "vLLM against trainer log-probs", _each("engine/"), "engine/*"),
    FigureSpec(
        "replay",
        "Replay",
        "stored trajectories trained on again ([replay]): rows, problems, tokens, their reward, accuracy and age in "
        "steps, rows left out, their correction's weights; and the update's trained tokens, fresh and replayed",
        lambda runs: [
            *_each("replay/")(runs),
            Panel(
                "trained tokens per step",
                (metric(TRAINED, "fresh and replayed"), metric(f"{TRAINED}/replay", "replayed")),
                "tokens",
            ),
        ],
        f"replay/*, {TRAINED}, {TRAINED}/replay",
    ),
)
