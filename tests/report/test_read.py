"""The report's SQL (sql/queries/report_*.sql), each statement exercised on a real store."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.db import sqlfiles
from lanpo.db.repo.attempts import NewAttempt, NewGroup, record_groups
from lanpo.db.repo.runs import record_metrics
from lanpo.errors import InputError
from lanpo.report import read
from tests.db.store_helpers import make_problems
from tests.report.helpers import fill_experiment, make_experiment, make_run

QUERIES = [
    "report_lesson_lift",  # tests/report/test_lesson_lift.py
    "report_metrics",
    "report_names",
    "report_runs",
    "report_targets",
    "report_val_attempts",
]


def test_every_report_query_is_tested_here() -> None:
    assert [n.split("/")[1] for n in sqlfiles.names("queries") if n.startswith("queries/report_")] == QUERIES


def test_targets_by_name_prefix_and_duplicates(session: Session) -> None:
    """report_targets: a run, an experiment, `run:` / `experiment:` prefixes; a name given twice counts once."""
    fill_experiment(session)
    targets = read.resolve_targets(session, ["exp", "exp-grpo-s1", "run:exp-grpo-s1", "experiment:exp"])
    assert [(t.kind, t.name) for t in targets] == [("experiment", "exp"), ("run", "exp-grpo-s1")]


def test_ambiguous_and_unknown_names(session: Session) -> None:
    """report_names: the hint lists experiments, then runs (LISTED characters of names at most), and a
    close match."""
    make_experiment(session, "twin")
    make_run(session, "twin")
    for i in range(10):
        make_run(session, f"run-{i:02d}")
    session.commit()
    with pytest.raises(InputError, match="'twin' names both a run and an experiment") as ambiguous:
        read.resolve_targets(session, ["twin"])
    assert ambiguous.value.hint == "say which: run:twin or experiment:twin"
    assert [t.kind for t in read.resolve_targets(session, ["run:twin"])] == ["run"]
    with pytest.raises(InputError, match="no run or experiment named 'twim'") as unknown:
        read.resolve_targets(session, ["twim"])
    assert unknown.value.hint is not None
    assert unknown.value.hint.startswith("did you mean twin? experiments: twin; runs: ")
    assert unknown.value.hint.endswith("runs: run-00, run-01, run-02, run-03, run-04 and 6 more")  # LISTED characters


def test_unknown_name_in_an_empty_store(session: Session) -> None:
    with pytest.raises(InputError) as empty:
        read.resolve_targets(session, ["x"])
    assert empty.value.hint == "the store has no runs yet: train one first"


def test_runs_of_an_experiment_with_their_config(session: Session) -> None:
    """report_runs: an experiment's runs with arm, seed, feedback mode, p_t, group size and last committed step."""
    ids = fill_experiment(session)
    lone = make_run(session, "lone", seed=2**62 + 1, mode="intra", p_t=0.75)
    session.commit()
    targets = read.resolve_targets(session, ["exp", "lone"])
    runs = {r.id: r for r in read.load_runs(session, targets)}
    assert set(runs) == {*ids.values(), lone}
    grpo = runs[ids[("grpo", 2)]]
    assert (grpo.experiment, grpo.arm, grpo.seed, grpo.feedback_mode, grpo.asked_p_t) == ("exp", "grpo", 2, "none", 0)
    assert (grpo.group_size, grpo.last_step, grpo.status) == (2, 4, "running")
    assert (runs[lone].seed, runs[lone].p_t, runs[lone].experiment, runs[lone].last_step) == (
        2**62 + 1,
        0.75,
        None,
        None,
    )


def test_an_experiment_without_runs(session: Session) -> None:
    make_experiment(session, "empty")
    session.commit()
    with pytest.raises(InputError, match="experiment 'empty' has no runs yet"):
        read.load_runs(session, read.resolve_targets(session, ["empty"]))


def test_metrics_in_step_order(session: Session) -> None:
    """report_metrics: one series per name, in step order, NaN and None kept as NaN."""
    run = make_run(session, "m")
    for step, value in ((2, 0.5), (0, None), (1, math.nan)):
        record_metrics(session, run, step, {"loss": value, "kl": float(step)})
    session.commit()
    series = read.load_metrics(session, [run])[run]
    assert series["loss"].steps.tolist() == [0, 1, 2] and series["kl"].values.tolist() == [0.0, 1.0, 2.0]
    assert math.isnan(series["loss"].values[0]) and math.isnan(series["loss"].values[1])
    assert series["loss"].last() == (2, 0.5)


def test_validation_recounted_from_val_attempts(session: Session) -> None:
    """report_val_attempts: mean@k, pass@k and boxed of `val` groups, by hand; runs with val metrics keep theirs."""
    a, b = make_problems(session, 2, dataset="gsm")
    (c,) = make_problems(session, 1, dataset="math")
    run = make_run(session, "v")

    def val(problem: int, step: int, correct: list[bool | None], formatted: list[bool]) -> NewGroup:
        attempts = [NewAttempt("r", correct=x, format_ok=f) for x, f in zip(correct, formatted, strict=True)]
        return NewGroup(problem, "val", "p", attempts, step=step, run_id=run)

    record_groups(
        session,
        [
            val(a, 0, [True, False, False, False], [True, True, False, False]),  # a: 1/4
            val(b, 0, [False, False], [False, False]),  # b: 0/4 over two groups of 2
            val(b, 0, [None, False], [False, False]),  # an ungraded sample counts as wrong
            val(c, 0, [True, True, True, True], [True] * 4),
            val(a, 5, [True, True, False, False], [True] * 4),
            NewGroup(a, "zero_shot", "p", [NewAttempt("r", correct=True)], step=5, run_id=run),  # training: ignored
        ],
    )
    session.commit()
    series = read.validation_from_attempts(session, [run])[run]
    stats = ("boxed", "mean@4", "pass@4", "samples")
    assert sorted(series) == [f"val/{d}/{s}" for d in ("gsm", "math") for s in stats]
    assert series["val/gsm/samples"].values.tolist() == [8.0, 4.0]  # every sample: the matched budget's n
    assert series["val/gsm/mean@4"].values.tolist() == pytest.approx([(0.25 + 0.0) / 2, 0.5])
    assert series["val/gsm/pass@4"].values.tolist() == [0.5, 1.0]
    assert series["val/gsm/boxed"].values.tolist() == pytest.approx([2 / 8, 1.0])
    assert series["val/gsm/mean@4"].steps.tolist() == [0, 5]
    assert series["val/math/mean@4"].values.tolist() == [1.0]
    # the standard error of mean@k over the problems: step 0's shares 1/4 and 0/4 (sample std 0.177, over sqrt 2);
    # one problem (step 5, math) has none
    errors = read.validation_errors(session, [run])[run]
    assert sorted(errors) == ["val/gsm/mean@4", "val/math/mean@4"]
    assert errors["val/gsm/mean@4"].values[0] == pytest.approx(math.sqrt(0.25**2 / 2) / math.sqrt(2))
    assert math.isnan(errors["val/gsm/mean@4"].values[1]) and math.isnan(errors["val/math/mean@4"].values[0])

    _, data = read.read_runs(session, ["v"])
    assert data[0].notes == ["validation recounted from its stored `val` attempts (no val/ metrics recorded)"]
    assert sorted(data[0].errors) == ["val/gsm/mean@4", "val/math/mean@4"]
    record_metrics(session, run, 0, {"val/gsm/mean@4": 0.9})
    session.commit()
    _, data = read.read_runs(session, ["v"])
    assert data[0].notes == [] and data[0].metrics["val/gsm/mean@4"].values.tolist() == [0.9]
    assert "val/math/mean@4" not in data[0].metrics  # the recorded metrics are the truth: no mixing
    assert sorted(data[0].errors) == ["val/gsm/mean@4"]  # the attempts it was counted from give its error


def test_report_reads_as_the_sql_role_sees_it(session: Session) -> None:
    """The queries run in a read-only transaction (they write nothing)."""
    fill_experiment(session)
    session.execute(sa.text("SET TRANSACTION READ ONLY"))
    _, data = read.read_runs(session, ["exp"])
    assert len(data) == 6 and all("reward/mean" in r.metrics for r in data)
    session.rollback()


def test_metrics_recorded_before_a_rename_read_under_todays_names() -> None:
    assert read.current_metric_name("format/rate") == "format/headers"
    assert read.current_metric_name("val/gsm/format") == "val/gsm/boxed"
    for name in ("format/headers", "val/gsm/boxed", "summary/format", "summary/rejected/format", "reward/mean"):
        assert read.current_metric_name(name) == name
