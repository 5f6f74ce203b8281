"""report.md: the runs, the Table 1-shaped results, every figure embedded, the lessons the runs used, and what was
not recorded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from lanpo.report import lesson_lift, matched
from lanpo.report.figures import FigureSpec, Panel
from lanpo.report.output import MARKER
from lanpo.report.series import BAND_LABELS, Band, Line
from lanpo.report.table import GENERATED_TOKENS, PROMPT_TOKENS, TRAINING_MINUTES, ResultTable


@dataclass(frozen=True)
class Drawn:
    """A figure of the catalogue and what became of it: its panels with data, and those without."""

    spec: FigureSpec
    kept: list[Panel]
    missing: list[Panel]

    @property
    def file(self) -> str | None:
        return f"{self.spec.name}.png" if self.kept else None


def report_markdown(
    title: str,
    command: str,
    written_at: datetime,
    lines: Sequence[Line],
    table: ResultTable,
    drawn: Sequence[Drawn],
    unplotted: Sequence[str],
    band: Band,
    at_budget: matched.MatchedTable | None = None,
    lessons: Sequence[lesson_lift.LessonPoint] = (),
) -> str:
    runs = [r for line in lines for r in line.runs]
    these = "this run" if len(runs) == 1 else "these runs"
    out = [
        MARKER,
        f"# lanpo report: {title}",
        "",
        f"Written by `{command}` at {written_at:%Y-%m-%d %H:%M:%S %Z} from the lanpo store, the source of truth: "
        "every number here is read from `runs`, `run_metrics`, the stored attempts and, for the lessons the runs "
        "used, `lesson_history`.",
    ]
    if any(line.seeds > 1 for line in lines):
        out.append(
            f"A line over several seeds is their mean at each step; its shaded band is the {BAND_LABELS[band]}."
        )
    out += ["", "## Runs", "", "| run | experiment | arm | seed | feedback | p_t asked | status | last step |"]
    out.append("| --- | --- | --- | ---: | --- | ---: | --- | ---: |")
    for r in runs:
        info = r.run
        cells = [
            info.name,
            info.experiment,
            info.arm,
            info.seed,
            info.feedback_mode,
            info.p_t,
            info.status,
            info.last_step,
        ]
        out.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    notes = [f"- {r.run.name}: {note}" for r in runs for note in r.notes]
    out += ["", *notes] if notes else []
    out += ["", "## Results", "", *_results(table, these)]
    out += _matched(at_budget)
    out += ["", "## Figures"]
    for d in drawn:
        if d.file is None:
            continue
        out += ["", f"### {d.spec.title}", "", f"{d.spec.about}.", "", f"![{d.spec.title}]({d.file})"]
        if d.missing:
            gaps = "; ".join(f"{p.title} ({', '.join(p.reads)})" for p in d.missing)
            out += ["", f"Panels left out, not recorded by {these}: {gaps}."]
    out += _lessons(lessons, these)
    absent = [d for d in drawn if d.file is None]
    if absent:
        out += ["", f"## Not recorded by {these}", ""]
        out += [
            f"- {d.spec.title} (`{d.spec.name}.png`, from {d.spec.pattern}): not recorded by {these}." for d in absent
        ]
    if unplotted:
        out += ["", "Recorded but in no figure: " + ", ".join(f"`{n}`" for n in unplotted) + "."]
    return "\n".join(out) + "\n"


def _matched(at_budget: matched.MatchedTable | None) -> list[str]:
    """The matched-budget table: each line's mean@k at the smallest line's final generated-token budget."""
    if at_budget is None or at_budget.budget is None or not at_budget.rows:
        return []
    out = [
        "",
        f"**At a matched budget of {at_budget.budget:,.0f} generated tokens** (the smallest line's final budget), in "
        "percent: each run's mean@k interpolated linearly between the two validations that bracket the budget, "
        "acc = (1 − w) a_i + w a_j with w = (B − x_i) / (x_j − x_i), ± its binomial SE sqrt((1 − w)² a_i(1 − a_i)/n_i "
        "+ w² a_j(1 − a_j)/n_j) (n: the validation's samples, problems × k, recorded or counted from the stored val "
        "attempts; no SE without); a line "
        "over seeds: their mean, SE sqrt(Σ SE²) / seeds. `-`: no value, with why (never reaches: its validations end "
        "below the budget; starts above: its first one is past it). A line's final budget is its smallest seed's "
        "generated tokens at its last validation.",
        "",
        at_budget.to_markdown(),
    ]
    if any(r.rollouts_only for r in at_budget.rows):
        out += [
            "† some step of a seed was recorded before `cost/generated_tokens`: its rollouts' tokens alone, so "
            "its budget is understated there.",
            "",
        ]
    out.append(f"Each seed's value, SE and bracketing steps: `{matched.CSV}`.")
    if matched.drawable(at_budget):
        out += ["", f"![accuracy at a matched budget]({matched.FIGURE})"]
    return out


def _lessons(lessons: Sequence[lesson_lift.LessonPoint], these: str) -> list[str]:
    """The lesson versions the runs used: how many in each probation state, the figure of their lift."""
    if not lessons:
        return []
    states = ", ".join(f"{n} {state}" for state, n in lesson_lift.counts(lessons).items())
    out = [
        "",
        "### Lessons used: lift against graded attempts",
        "",
        f"The {len(lessons)} lesson version(s) a rollout group of {these} carried ({states}), each with its record "
        "in `lesson_history` over the whole store as it is now: x its graded attempts (log scale), y its lift over "
        "the zero-shot baseline, the bar its 95 % interval, the colour its probation (retired: retired by its "
        "record; helps / hurts: the interval lies above / below 0; trying: it spans 0; untried: nothing graded yet, "
        f"no point). Each version's numbers: `{lesson_lift.CSV}`.",
    ]
    if lesson_lift.by_state(lessons):
        return [*out, "", f"![lift against graded attempts]({lesson_lift.FIGURE})"]
    return [*out, "", "No figure: none of them has a graded attempt yet."]


def _results(table: ResultTable, these: str) -> list[str]:
    if not table.datasets:
        return [
            f"No validation was recorded by {these} (`val/<dataset>/mean@<k>` metrics or `val` attempts), so the "
            "Table 1-shaped results are empty."
        ]
    ks = sorted(set(table.ks.values()))
    k = f"mean@{ks[0]}" if len(ks) == 1 else "mean@k"
    out = [
        f"**Held-out {k} at the last validated step**, in percent: mean ± sample std (ddof=1) over seeds; "
        "Average = each run's unweighted mean over the datasets, then over seeds.",
        "",
        table.to_markdown("final"),
    ]
    steps = [f"{r.label}: {', '.join(map(str, r.final_steps))}" for r in table.rows if r.final_steps]
    out += [f"Last validated step per run — {'; '.join(steps)}.", ""]
    out += [
        f"What it cost, up to each run's last validated step, mean over seeds (`-`: not recorded by the run): "
        f"*{GENERATED_TOKENS}*, every token the training generated: rollouts, summaries, MEL's diagnoses and "
        "replays (`cost/generated_tokens`; a step recorded before it counts its rollouts alone, said in the notes "
        f"above; not validation); *{TRAINING_MINUTES}*, the wall time of the committed training steps (the sum of "
        f"`time/step`; not validation or start-up); *{PROMPT_TOKENS}*, the prompt tokens those generations read "
        "(`cost/prompt_tokens`, a prompt once per sample). The same axes as the figures against tokens and time.",
        "",
    ]
    start = table.to_markdown("start")
    out += ["**At step 0, before any update**", "", start] if start else [f"No step-0 validation by {these}.", ""]
    diff = table.to_markdown("diff")
    if diff:
        out += [
            "**Paired difference against the baseline arm**, in percentage points: for each seed, the arm's value "
            "minus the baseline's for the same seed, at the last validated step; mean ± sample std over the pairs.",
            "",
            diff,
        ]
    elif any(r.line.experiment for r in table.rows):
        out += [
            "No paired difference: no baseline arm (an arm named `grpo`, one without feedback, or `--baseline`).",
            "",
        ]
    out.append("The same numbers, as fractions with each seed's value: `table.csv`.")
    return out
