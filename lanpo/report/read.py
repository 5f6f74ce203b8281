"""Reading a report's runs from the store: names resolved to runs or experiments, metrics, validation.

Repository functions: a session in, dataclasses out, the SQL in `sql/queries/report_*.sql`. The database is the
source of truth; nothing here writes. Validation is read from `val/<dataset>/mean@<k>` metrics, or recounted
from the run's stored `val` attempts when it recorded attempts but no such metric; the standard error of each
mean@k over the held-out problems comes from those attempts.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.errors import InputError, listing
from lanpo.report.series import RunData, RunInfo, Series

KINDS = ("run", "experiment")
LISTED = 40  # characters of names a hint lists per kind before "and N more"


@dataclass(frozen=True)
class Target:
    kind: str  # run | experiment
    id: int
    name: str


def resolve_targets(session: Session, names: Sequence[str]) -> list[Target]:
    """Each name as a run or an experiment (`run:NAME` / `experiment:NAME` say which); duplicates dropped.

    InputError (with the names that exist) when a name matches nothing, or both a run and an experiment.
    """
    lookup = set(names)
    for name in names:
        kind, _, rest = name.partition(":")
        if kind in KINDS and rest:
            lookup.add(rest)
    found = [Target(r.kind, int(r.id), r.name) for r in session.execute(_q("targets"), {"names": sorted(lookup)})]
    out: list[Target] = []
    for name in names:
        exact = [t for t in found if t.name == name]
        kind, _, rest = name.partition(":")
        if not exact and kind in KINDS and rest:
            exact = [t for t in found if t.kind == kind and t.name == rest]
        if len(exact) > 1:
            raise InputError(
                f"{name!r} names both a run and an experiment", hint=f"say which: run:{name} or experiment:{name}"
            )
        if not exact:
            raise _unknown(session, name)
        if exact[0] not in out:
            out.append(exact[0])
    return out


def _unknown(session: Session, name: str) -> InputError:
    rows = session.execute(_q("names")).all()
    if not rows:
        return InputError(f"no run or experiment named {name!r}", hint="the store has no runs yet: train one first")
    every = list(dict.fromkeys(r.name for r in rows))  # a name may be a run's and an experiment's
    kind, _, rest = name.partition(":")
    close = difflib.get_close_matches(rest if kind in KINDS and rest else name, every, n=3, cutoff=0.6)
    experiments, runs = ([r.name for r in rows if r.kind == kind] for kind in ("experiment", "run"))
    listed_experiments = f"experiments: {listing(experiments, LISTED)}" if experiments else ""
    listed_runs = f"runs: {listing(runs, LISTED)}" if runs else ""
    guess = f"did you mean {listing(close, 30)}? " if close else ""
    hint = f"{guess}{listed_experiments}{'; ' if experiments and runs else ''}{listed_runs}"
    return InputError(f"no run or experiment named {name!r}", hint=hint)


def load_runs(session: Session, targets: Sequence[Target]) -> list[RunInfo]:
    """The runs named, and every run of the experiments named (InputError for an experiment without runs)."""
    params = {
        "run_ids": [t.id for t in targets if t.kind == "run"],
        "experiment_ids": [t.id for t in targets if t.kind == "experiment"],
    }
    runs = [_run_info(r) for r in session.execute(_q("runs"), params)]
    for t in targets:
        if t.kind == "experiment" and not any(r.experiment == t.name for r in runs):
            raise InputError(
                f"experiment {t.name!r} has no runs yet",
                hint="runs join an experiment through runs.experiment_id and runs.arm; report a run by its name",
            )
    return runs


def current_metric_name(name: str) -> str:
    """A metric's name today: runs recorded before a rename keep the old name in `run_metrics`."""
    if name == "format/rate":  # training's feedback-format share, now format/headers
        return "format/headers"
    if name.startswith("val/") and name.endswith("/format"):  # validation's boxed-answer share, now val/<d>/boxed
        return name.removesuffix("/format") + "/boxed"
    return name


def load_metrics(session: Session, run_ids: Sequence[int]) -> dict[int, dict[str, Series]]:
    """run id -> metric name (as named today) -> its series over steps, as `run_metrics` holds it."""
    rows: dict[tuple[int, str], tuple[list[int], list[float | None]]] = defaultdict(lambda: ([], []))
    for r in session.execute(_q("metrics"), {"run_ids": list(run_ids)}):
        steps, values = rows[(r.run_id, current_metric_name(r.name))]
        steps.append(r.step)
        values.append(r.value)
    out: dict[int, dict[str, Series]] = defaultdict(dict)
    for (run_id, name), (steps, values) in rows.items():
        out[run_id][name] = Series.of(steps, values)
    return out


def validation_from_attempts(session: Session, run_ids: Sequence[int]) -> dict[int, dict[str, Series]]:
    """run id -> `val/<dataset>/mean@<k>`, `pass@<k>` and `boxed` series recounted from its `val` attempts."""
    return _recount(session, run_ids)[0]


def validation_errors(session: Session, run_ids: Sequence[int]) -> dict[int, dict[str, Series]]:
    """run id -> `val/<dataset>/mean@<k>` -> its standard error over the held-out problems, per step."""
    return _recount(session, run_ids)[1]


def _recount(
    session: Session, run_ids: Sequence[int]
) -> tuple[dict[int, dict[str, Series]], dict[int, dict[str, Series]]]:
    """(validation recounted from the `val` attempts, the standard error of each mean@k), by run id and name."""
    cells: dict[tuple[int, str, str], tuple[list[int], list[float | None]]] = defaultdict(lambda: ([], []))
    ks: dict[tuple[int, str], int] = defaultdict(int)
    rows = session.execute(_q("val_attempts"), {"run_ids": list(run_ids)}).all()
    for r in rows:
        ks[(r.run_id, r.dataset)] = max(ks[(r.run_id, r.dataset)], int(r.k))
    for r in rows:
        k = ks[(r.run_id, r.dataset)]
        se = None if r.mean_at_k_se is None else float(r.mean_at_k_se)
        stats = (
            (f"mean@{k}", r.mean_at_k),
            (f"pass@{k}", r.pass_at_k),
            ("boxed", r.boxed_rate),
            ("se", se),
            ("samples", r.samples),
        )
        for stat, value in stats:
            steps, values = cells[(r.run_id, r.dataset, stat)]
            steps.append(int(r.step))
            values.append(None if value is None else float(value))
    metrics: dict[int, dict[str, Series]] = defaultdict(dict)
    errors: dict[int, dict[str, Series]] = defaultdict(dict)
    for (run_id, dataset, stat), (steps, values) in cells.items():
        if stat == "se":
            errors[run_id][f"val/{dataset}/mean@{ks[(run_id, dataset)]}"] = Series.of(steps, values)
        else:
            metrics[run_id][f"val/{dataset}/{stat}"] = Series.of(steps, values)
    return metrics, errors


def read_runs(session: Session, names: Sequence[str]) -> tuple[list[Target], list[RunData]]:
    """The targets named and their runs' data: metrics, plus validation recounted where no val metric exists."""
    targets = resolve_targets(session, names)
    runs = load_runs(session, targets)
    ids = [r.id for r in runs]
    metrics = load_metrics(session, ids)
    recounted, errors = _recount(session, ids)
    data = []
    for run in runs:
        own = dict(metrics.get(run.id, {}))
        notes = []
        has_val = any(n.startswith("val/") and "/mean@" in n for n in own)
        if not has_val and recounted.get(run.id):
            own.update(recounted[run.id])
            notes.append("validation recounted from its stored `val` attempts (no val/ metrics recorded)")
        # the samples of each validation (the matched budget's n), where the run did not record them
        own |= {n: s for n, s in recounted.get(run.id, {}).items() if n.endswith("/samples") and n not in own}
        # the attempts a recorded mean@k was counted from give its standard error (validate records both)
        known = {name: se for name, se in errors.get(run.id, {}).items() if name in own}
        data.append(RunData(run, own, notes, known))
    return targets, data


def _run_info(r: Any) -> RunInfo:
    return RunInfo(
        id=int(r.id),
        name=r.name,
        kind=r.kind,
        status=r.status,
        started_at=r.started_at,
        finished_at=r.finished_at,
        experiment=r.experiment,
        arm=r.arm,
        seed=_number(r.seed, int),
        feedback_mode=r.feedback_mode,
        p_t=_number(r.p_t, float),
        group_size=_number(r.group_size, int),
        last_step=r.last_step,
    )


def _number(text: str | None, kind: type) -> Any:
    """A config value read as text (jsonb ->>) as int or float; None when absent or not a number."""
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        pass
    try:
        value = float(text)
        return kind(value) if kind is float or value.is_integer() else None
    except (ValueError, OverflowError):
        return None


def _q(name: str) -> Any:
    return sqlfiles.load(f"queries/report_{name}")
