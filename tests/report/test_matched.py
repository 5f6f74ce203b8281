"""The matched-budget table: each arm's held-out accuracy at the smallest arm's final budget of generated tokens.

Interpolation and its binomial SE against a hand computation; the budget chosen over two arms of two seeds by hand;
an arm whose validations never reach the budget (and one that starts above it) gives no value and says why; an
older run without cost/* or the samples count; and the report's table, figure and csv from an experiment written
as the trainer writes it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from lanpo.report.build import read_report, write_report
from lanpo.report.matched import AtBudget, at_budget, matched_table
from lanpo.report.series import Line, RunData, RunInfo, Series
from tests.report.helpers import make_experiment, make_run, write_run
from tests.report.test_cli import assert_has_content


def test_interpolation_and_its_se_by_hand() -> None:
    """Between (100 tokens, 0.4, n 100) and (300, 0.6, n 200) at 200: w = 1/2, acc 0.5,
    SE = sqrt(0.25 x 0.4 x 0.6 / 100 + 0.25 x 0.6 x 0.4 / 200) = sqrt(0.0006 + 0.0003) = 0.03."""
    costs, acc, n, steps = [0.0, 100.0, 300.0], [0.2, 0.4, 0.6], [100.0, 100.0, 200.0], [0, 2, 4]
    got = at_budget(costs, acc, n, steps, 200.0)
    assert got.value == pytest.approx(0.5) and got.se == pytest.approx(0.03) and got.steps == (2, 4)
    quarter = at_budget(costs, acc, n, steps, 150.0)  # w = 1/4: 0.45, sqrt(0.5625 x 0.0024 + 0.0625 x 0.0012)
    assert quarter.value == pytest.approx(0.45)
    assert quarter.se == pytest.approx(math.sqrt(0.5625 * 0.0024 + 0.0625 * 0.0012))
    exact = at_budget(costs, acc, n, steps, 100.0)  # at a validation: that point's own binomial SE
    assert (
        exact.value == pytest.approx(0.4)
        and exact.se == pytest.approx(math.sqrt(0.24 / 100))
        and exact.steps == (2, 2)
    )
    assert at_budget(costs, acc, n, steps, 301.0) == AtBudget(None, why="never reaches")
    assert at_budget([50.0, 80.0], [0.1, 0.2], [10.0, 10.0], [1, 2], 10.0) == AtBudget(None, why="starts above")
    unknown = at_budget(costs, acc, [math.nan] * 3, steps, 200.0)  # recorded before val/<d>/samples: no SE
    assert unknown.value == pytest.approx(0.5) and unknown.se is None


def _run(index: int, generated: dict[int, float], val: dict[int, float], samples: float | None = 100.0) -> RunData:
    metrics = {
        "cost/generated_tokens": Series.of(list(generated), list(generated.values())),
        "val/d/mean@4": Series.of(list(val), list(val.values())),
    }
    if samples is not None:
        metrics["val/d/samples"] = Series.of(list(val), [samples] * len(val))
    return RunData(RunInfo(index, f"r{index}", "train", "finished", seed=index), metrics)


def test_budget_is_the_smallest_arms_final_budget() -> None:
    """Arm a (seeds at 300 and 400 tokens by step 2) ends at 300; arm b (500) is read at 300 between its steps."""
    a = Line("a", [_run(1, {1: 100.0, 2: 200.0}, {0: 0.2, 2: 0.5}), _run(2, {1: 200.0, 2: 200.0}, {0: 0.2, 2: 0.6})])
    b = Line("b", [_run(3, {1: 200.0, 2: 300.0}, {0: 0.1, 1: 0.3, 2: 0.7})])
    table = matched_table([a, b])
    assert table.budget == 300.0 and table.columns == ["d"]
    row_a, row_b = table.rows
    assert row_a.final_budget == 300.0 and row_b.final_budget == 500.0
    # a: seed 1 at its last point (0.5), seed 2 between 0 tokens (0.2) and 400 (0.6) at w = 3/4: 0.5
    assert [r["d"].value for r in row_a.per_run] == pytest.approx([0.5, 0.5])
    se_1, se_2 = math.sqrt(0.25 / 100), math.sqrt(0.25**2 * 0.16 / 100 + 0.75**2 * 0.24 / 100)
    mean, se, seeds = row_a.cell("d") or (0.0, None, 0)
    assert (mean, seeds) == (pytest.approx(0.5), 2) and se == pytest.approx(math.sqrt(se_1**2 + se_2**2) / 2)
    # b: between step 1 (200 tokens, 0.3) and step 2 (500, 0.7) at w = 1/3
    assert row_b.per_run[0]["d"].value == pytest.approx(0.3 + 0.4 / 3) and row_b.per_run[0]["d"].steps == (1, 2)
    markdown = table.to_markdown()
    assert "| a | 2 of 2 | 300 | 50.0 ± " in markdown and "| b | 1 of 1 | 500 | 43.3 ± " in markdown


def test_an_arm_that_never_reaches_the_budget() -> None:
    """A budget past an arm's last validation (or before its first) gives no value, and the table says why."""
    short = Line("short", [_run(1, {1: 100.0, 2: 100.0}, {0: 0.2, 2: 0.3})])
    late = Line("late", [_run(2, {1: 400.0, 2: 400.0}, {2: 0.4})])  # first validated at 800 tokens
    table = matched_table([short, late], budget=500.0)
    assert table.rows[0].per_run[0]["d"] == AtBudget(None, why="never reaches")
    assert table.rows[1].per_run[0]["d"] == AtBudget(None, why="starts above")
    markdown = table.to_markdown()
    assert "| short | 0 of 1 | 200 | - (never reaches) |" in markdown
    assert "| late | 0 of 1 | 800 | - (starts above) |" in markdown
    default = matched_table([short, late])  # the smaller final budget: short's 200, which late starts past
    assert default.budget == 200.0 and default.rows[1].per_run[0]["d"].why == "starts above"


def test_an_older_run_without_cost_or_samples() -> None:
    """An older run's budget is its rollouts' tokens (tokens/completion, flagged †); no samples count: no SE."""
    old = RunData(
        RunInfo(1, "old", "train", "finished"),
        {"tokens/completion": Series.of([1, 2], [100.0, 100.0]), "val/d/mean@4": Series.of([0, 2], [0.2, 0.4])},
    )
    new = _run(2, {1: 50.0, 2: 50.0}, {0: 0.2, 2: 0.3}, samples=None)
    table = matched_table([Line("old", [old]), Line("new", [new])])
    assert table.budget == 100.0
    assert table.rows[0].rollouts_only and not table.rows[1].rollouts_only
    assert table.rows[0].per_run[0]["d"].value == pytest.approx(0.3) and table.rows[0].per_run[0]["d"].se is None
    assert "| old † | 1 of 1 | 200 | 30.0 |" in table.to_markdown()
    metrics = {"val/d/mean@4": Series.of([0, 1], [0.1, 0.2]), "loss": Series.of([1], [0.5])}
    nothing = RunData(RunInfo(3, "none", "train", "finished"), metrics)  # trained, no token count at all
    assert (
        matched_table([Line("none", [nothing])]).budget is None
        and not matched_table([Line("x", [nothing])]).to_markdown()
    )


def test_the_report_draws_the_matched_budget(session: Session, tmp_path: Path) -> None:
    """Two arms x two seeds written as the trainer writes them: the table in report.md, the figure and the csv."""
    experiment = make_experiment(session)
    for arm, mode in (("grpo", "none"), ("lanpo-both", "both")):
        for index in (0, 1):
            run_id = make_run(session, f"{arm}-s{index}", index, mode, 0.5, experiment, arm)
            write_run(session, run_id, arm, index, mode, steps=4)  # validated at 0, 2, 4
    session.commit()
    data = read_report(session, ["exp"])
    result = write_report(data, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    # helpers.step_groups: 172 + 8 step + 8 seed generated tokens a step; seed 0's 4 steps are the smallest: 768
    assert "**At a matched budget of 768 generated tokens**" in report
    assert "| grpo | 2 of 2 | 768 |" in report and "| lanpo-both | 2 of 2 | 768 |" in report
    assert "matched_budget.png" in result.figures
    assert_has_content(tmp_path / "out" / "matched_budget.png")
    rows = (tmp_path / "out" / "matched_budget.csv").read_text().splitlines()
    assert rows[0] == "row,column,run,budget,value,se,from_step,to_step,why" and len(rows) == 1 + 2 * 2 * 3
