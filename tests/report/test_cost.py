"""The compute-matched view: held-out accuracy against cumulative generated tokens and training seconds.

The cumulative series and the interpolated band against hand computations and a plain loop; the table's cost
columns over two seeds by hand; an old run without the token metric; and the trainer's `tokens/completion` and
`tokens/prompt` against the attempts a real two-step tiny run stored.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.feedback_modes import PROMPT_MODES
from lanpo.report import cost
from lanpo.report.build import read_report
from lanpo.report.cost import PROMPT_AXIS, SECONDS_AXIS, TOKENS_AXIS, against
from lanpo.report.series import RunData, RunInfo, Series, band_on_grid
from lanpo.report.table import GENERATED_TOKENS, TRAINING_MINUTES, result_table
from lanpo.train.config import ValidationConfig
from lanpo.train.loop import train
from tests.report.helpers import make_experiment, make_run, write_run
from tests.report.test_cli import assert_has_content
from tests.train.conftest import tiny_config


def run_with(metrics: dict[str, dict[int, float]]) -> RunData:
    info = RunInfo(1, "r", "train", "running")
    return RunData(info, {k: Series.of(list(v), list(v.values())) for k, v in metrics.items()})


def values(series: Series | None) -> list[float]:
    assert series is not None
    return series.values.tolist()


def test_cumulative_tokens_and_seconds_by_hand() -> None:
    """Step 0 at 0, then the running sum of each step's cost; validation read at its steps' cost."""
    run = run_with(
        {
            "cost/generated_tokens": {1: 100.0, 2: 150.0, 3: 50.0},
            "cost/prompt_tokens": {1: 40.0, 2: 40.0, 3: 40.0},
            "tokens/completion": {1: 60.0, 2: 70.0, 3: 30.0},  # the rollouts' part: cost/* wins where recorded
            "time/step": {1: 2.0, 2: 3.0, 3: 1.5},
            "val/d/mean@4": {0: 0.1, 2: 0.3, 3: 0.4},
        }
    )
    assert values(PROMPT_AXIS.of(run)) == [0.0, 40.0, 80.0, 120.0]
    tokens, seconds = TOKENS_AXIS.of(run), SECONDS_AXIS.of(run)
    assert tokens is not None and tokens.steps.tolist() == [0, 1, 2, 3]
    assert values(tokens) == [0.0, 100.0, 250.0, 300.0]
    assert values(seconds) == [0.0, 2.0, 5.0, 6.5]
    x, y = against(run.metrics["val/d/mean@4"], tokens) or (np.zeros(0), np.zeros(0))
    assert x.tolist() == [0.0, 250.0, 300.0] and y.tolist() == [0.1, 0.3, 0.4]
    assert cost.notes(run) == []
    assert SECONDS_AXIS.unit(6.5) == (1.0, "training seconds") and SECONDS_AXIS.unit(7200.0)[1] == "training hours"
    assert TOKENS_AXIS.unit(2.5e6) == (1e6, "generated tokens (millions)")


def test_older_steps_priced_from_mean_length_and_a_gap_ends_the_axis() -> None:
    """Steps recorded before tokens/completion: response_len/mean x rollouts; before cost/*: the rollouts' alone,
    said so; a step without time/step: unknown on."""
    run = run_with(
        {
            "response_len/mean": {1: 20.5, 2: 30.0, 3: 99.0},
            "count/zero_shot": {1: 4.0, 2: 2.0, 3: 1.0},
            "count/intra": {1: 0.0, 2: 2.0, 3: 1.0},
            "tokens/completion": {3: 50.0},  # resumed with the new trainer at step 3: the recorded sum wins
            "time/step": {1: 2.0, 3: 1.0},  # step 2 has metrics but no time/step
            "val/d/mean@4": {0: 0.1, 1: 0.2, 3: 0.4},
        }
    )
    assert values(TOKENS_AXIS.of(run)) == [0.0, 82.0, 202.0, 252.0]
    assert cost.completion_tokens(run).derived == (1, 2)
    seconds = values(SECONDS_AXIS.of(run))
    assert seconds[:2] == [0.0, 2.0] and all(math.isnan(v) for v in seconds[2:])
    pair = against(run.metrics["val/d/mean@4"], SECONDS_AXIS.of(run))
    assert pair is not None and pair[0].tolist() == [0.0, 2.0]  # step 3's validation: its cost is unknown
    assert cost.generated_tokens(run).rollouts_only == (1, 2, 3)
    notes = cost.notes(run)
    assert len(notes) == 4
    assert notes[0].startswith("cost/generated_tokens not recorded at 3 step(s) (from step 1): their generated tokens")
    assert "understated" in notes[0]
    assert notes[1].startswith("tokens/completion not recorded at 2 step(s) (from step 1)")
    assert notes[2].startswith("prompt tokens not recorded by this run (no cost/prompt_tokens or tokens/prompt)")
    assert notes[3].startswith("training seconds not recorded at step 2") and "validation_time.png" in notes[3]


def test_a_run_without_the_cost_says_so() -> None:
    run = run_with({"val/d/mean@4": {0: 0.1, 2: 0.3}, "loss": {1: 0.5, 2: 0.4}})
    assert TOKENS_AXIS.of(run) is None and SECONDS_AXIS.of(run) is None
    assert [n.split(" (")[0] for n in cost.notes(run)] == [
        "generated tokens not recorded by this run",
        "training seconds not recorded by this run",
    ]
    fresh = run_with({"val/d/mean@4": {0: 0.1}})  # validated at the start, no training step yet
    assert values(TOKENS_AXIS.of(fresh)) == [0.0] and cost.notes(fresh) == []


def test_band_on_grid_by_hand() -> None:
    """Two seeds: the union of their x inside the range both cover, each interpolated onto it."""
    a = (np.array([0.0, 100.0, 200.0]), np.array([0.0, 0.2, 0.4]))
    b = (np.array([0.0, 150.0, 300.0]), np.array([0.0, 0.3, 0.3]))
    agg = band_on_grid([a, b], "minmax")
    assert agg.x.tolist() == [0.0, 100.0, 150.0, 200.0]  # 300: only seed b got there
    assert np.allclose(agg.mean, [0.0, 0.2, 0.3, 0.35]) and agg.count.tolist() == [2, 2, 2, 2]
    assert np.allclose(agg.low, [0.0, 0.2, 0.3, 0.3]) and np.allclose(agg.high, [0.0, 0.2, 0.3, 0.4])
    std = band_on_grid([a, b], "std")
    assert np.allclose(std.high - std.mean, [0.0, 0.0, 0.0, statistics.stdev([0.4, 0.3])])
    one = band_on_grid([b])
    assert one.x.tolist() == b[0].tolist() and one.mean.tolist() == b[1].tolist()
    assert len(band_on_grid([]).x) == 0


def interpolate_loop(x: list[float], y: list[float], at: float) -> float:
    """The value of the piecewise-linear curve through (x, y) at `at`, x ascending: the reference for np.interp."""
    for i in range(len(x) - 1):
        if x[i] <= at <= x[i + 1]:
            return y[i] if x[i + 1] == x[i] else y[i] + (y[i + 1] - y[i]) * (at - x[i]) / (x[i + 1] - x[i])
    return y[-1]


steps_costs = st.lists(st.integers(1, 50), min_size=1, max_size=6)
accuracies = st.lists(st.floats(0, 1), min_size=7, max_size=7)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(steps_costs, accuracies), min_size=1, max_size=3))
def test_band_on_grid_equals_the_loop(seeds: list[tuple[list[int], list[float]]]) -> None:
    curves = []
    for costs, ys in seeds:
        x = np.cumsum([0, *costs]).astype(float)  # strictly increasing, from 0
        curves.append((x, np.array(ys[: len(x)])))
    agg = band_on_grid(curves, "minmax")
    end = min(x[-1] for x, _ in curves)
    assert agg.x.tolist() == sorted({float(v) for x, _ in curves for v in x if v <= end})
    for i, at in enumerate(agg.x):
        level = [interpolate_loop(x.tolist(), y.tolist(), at) for x, y in curves]
        assert math.isclose(agg.mean[i], statistics.fmean(level), abs_tol=1e-9)
        assert math.isclose(agg.low[i], min(level), abs_tol=1e-9)
        assert math.isclose(agg.high[i], max(level), abs_tol=1e-9)


def test_table_cost_columns_over_two_seeds(session: Session) -> None:
    """Tokens and minutes up to the last validated step (4, not the last step 5), mean over two seeds, by hand."""
    experiment = make_experiment(session)
    for arm, mode in (("grpo", "none"), ("lanpo-both", "both")):
        for index in (0, 1):
            run_id = make_run(session, f"{arm}-s{index}", index, mode, 0.5, experiment, arm)
            write_run(session, run_id, arm, index, mode, steps=5)  # validated at 0, 2, 4; trained to 5
    session.commit()
    data = read_report(session, ["exp"])
    table = result_table(data.lines, data.baselines)
    # helpers.step_groups: a step generates 172 + 8 step + 8 seed tokens; helpers.train_metrics: 5 + seed seconds
    tokens = [sum(172 + 8 * step + 8 * seed for step in range(1, 5)) for seed in (0, 1)]
    minutes = [sum(5.0 + seed for _ in range(1, 5)) / 60 for seed in (0, 1)]
    assert tokens == [768, 800]
    for row in table.rows:
        assert row.final_steps == (4, 4)
        assert row.cost[GENERATED_TOKENS].values == pytest.approx(tokens)
        assert row.cost[TRAINING_MINUTES].values == pytest.approx(minutes)
        assert row.cost[GENERATED_TOKENS].mean == pytest.approx(784.0)
    markdown = table.to_markdown("final")
    assert "| method | seeds | gsm | math | Average | generated tokens | training minutes |" in markdown
    assert re.search(r"\| lanpo-both \| 2 \| [^|]+ \| [^|]+ \| [^|]+ \| 784 \| 0\.4 \|", markdown), markdown
    assert "generated tokens" not in table.to_markdown("start") + table.to_markdown("diff")
    lines = [line.split(",") for line in table.to_csv().splitlines()]
    row = next(c for c in lines if c[:2] == ["final", "grpo"] and c[5] == GENERATED_TOKENS)
    assert row[7:] == ["2", "784.000000", f"{statistics.stdev(tokens):.6f}", "768.000000;800.000000", "4;4"]
    assert data.lines[0].runs[0].notes == []


def test_old_run_without_token_metrics_says_so(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    """Recorded before any token count: no tokens figure, a note and `-` in the table; the rest as ever."""
    experiment = make_experiment(session)
    ids = [make_run(session, f"exp-s{seed}", seed, "both", 0.5, experiment, "lanpo-both") for seed in (0, 1)]
    for index, run_id in enumerate(ids):
        write_run(session, run_id, "lanpo-both", index, "both")
    old = (
        "DELETE FROM run_metrics WHERE run_id = :r "
        "AND (name LIKE 'tokens/%' OR name LIKE 'cost/%' OR name = 'response_len/mean')"
    )
    session.execute(sa.text(old), {"r": ids[1]})
    session.commit()
    out = tmp_path / "mixed"
    assert run_cli("report", "exp", "--out", out).code == 0
    report = (out / "report.md").read_text()
    assert "- exp-s1: generated tokens not recorded by this run" in report and "- exp-s0:" not in report
    assert "| 768 (1 of 2) | 0.4 |" in report  # seed 0's tokens alone; minutes (20 s, 24 s) of both
    assert (out / "validation_tokens.png").exists()  # drawn from the seed that has it

    session.execute(sa.text("DELETE FROM runs WHERE id = :r"), {"r": ids[0]})
    session.commit()
    out = tmp_path / "old"
    result = run_cli("report", "exp-s1", "--out", out)
    assert result.code == 0, result.err
    report = (out / "report.md").read_text()
    assert not (out / "validation_tokens.png").exists()
    assert (out / "validation.png").exists() and (out / "validation_time.png").exists()
    assert (
        "- Validation mean@k against generated tokens (`validation_tokens.png`, from val/<dataset>/mean@<k> with "
        "cost/generated_tokens (or tokens/completion, or response_len/mean and count/<mode>)): not recorded by this "
        "run." in report
    )
    assert "- exp-s1: generated tokens not recorded by this run" in report
    assert re.search(r"\| exp-s1 \| 1 \| [^|]+ \| [^|]+ \| [^|]+ \| - \| 0\.4 \|", report), report
    assert "not recorded, so not drawn: Validation mean@k against generated tokens," in result.out


def test_token_metrics_of_a_real_tiny_run(
    run_cli: Callable[..., Any], db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """tokens/completion, tokens/prompt and cost/*/rollout equal what the step's training attempts stored, the total
    adds the summaries; validation's own cost equals its stored attempts; the report draws them and the matched
    budget."""
    with transaction(db) as session:
        upsert_problems(session, "toy-val", [Question(f"v{i}", f"What is {i} * 7?", str(7 * i)) for i in range(3)])
    validation = ValidationConfig(every=1, n=3, k=2, max_new_tokens=8)
    result = train(tiny_config(tmp_path, steps=2, eval=validation), db=db, progress=False)
    with db.connect() as conn:
        stored = conn.execute(
            sa.text(
                "SELECT step, sum(completion_tokens), sum(prompt_tokens) FROM run_attempts "
                "WHERE run_id = :r AND mode = ANY(:modes) GROUP BY step ORDER BY step"
            ),
            {"r": result.run_id, "modes": list(PROMPT_MODES)},
        ).all()
        recorded = conn.execute(
            sa.text(
                "SELECT step, name, value FROM run_metrics WHERE run_id = :r "
                "AND (name LIKE 'tokens/%' OR name LIKE 'cost/%') ORDER BY step"
            ),
            {"r": result.run_id},
        ).all()
        validation = conn.execute(
            sa.text(
                "SELECT step, sum(completion_tokens), sum(prompt_tokens) FROM run_attempts "
                "WHERE run_id = :r AND mode = 'val' GROUP BY step ORDER BY step"
            ),
            {"r": result.run_id},
        ).all()
    assert [s for s, _, _ in stored] == [1, 2]
    by_step = {(step, name): value for step, name, value in recorded}
    for step, completion, prompt in stored:
        assert by_step[(step, "tokens/completion")] == completion > 0
        assert by_step[(step, "tokens/prompt")] == prompt > 0
        assert result.metrics[step - 1]["tokens/completion"] == completion
        assert by_step[(step, "cost/generated_tokens/rollout")] == completion
        assert by_step[(step, "cost/prompt_tokens/rollout")] == prompt
        summary = by_step[(step, "cost/generated_tokens/summary")]
        assert by_step[(step, "cost/generated_tokens")] == completion + summary
        assert by_step[(step, "cost/prompt_tokens")] == prompt + by_step[(step, "cost/prompt_tokens/summary")]
        assert by_step[(step, "cost/generated_tokens/mel_replay")] == 0.0  # not MEL
    assert sum(by_step[(s, "cost/generated_tokens/summary")] for s in (1, 2)) > 0  # summaries were written
    assert [s for s, _, _ in validation] == [0, 1, 2]
    for step, completion, prompt in validation:  # recorded apart, on no axis
        assert by_step[(step, "cost/validation/generated_tokens")] == completion > 0
        assert by_step[(step, "cost/validation/prompt_tokens")] == prompt > 0

    out = tmp_path / "tiny-report"
    assert run_cli("report", "tiny", "--out", out).code == 0
    report = (out / "report.md").read_text()
    for figure in ("validation_tokens", "validation_time"):
        assert_has_content(out / f"{figure}.png")
        assert f"]({figure}.png)" in report
    with transaction(db) as session:
        (run,) = read_report(session, ["tiny"]).lines[0].runs
    generated = [by_step[(s, "cost/generated_tokens")] for s in (1, 2)]
    assert values(TOKENS_AXIS.of(run)) == [0.0, generated[0], generated[0] + generated[1]]
    assert_has_content(out / "matched_budget.png")
    assert f"**At a matched budget of {generated[0] + generated[1]:,.0f} generated tokens**" in report
    assert values(SECONDS_AXIS.of(run))[2] == pytest.approx(sum(m["time/step"] for m in result.metrics))
    assert "generated tokens | training minutes |" in report and run.notes == []
    assert values(run.metrics["val/toy-val/samples"]) == [6.0, 6.0, 6.0]  # 3 problems x k = 2: the matched n
    with db.begin() as conn:  # a run recorded before val/<d>/samples: its stored val attempts give the n
        conn.execute(
            sa.text("DELETE FROM run_metrics WHERE run_id = :r AND name LIKE 'val/%/samples'"), {"r": run.run.id}
        )
    with transaction(db) as session:
        (older,) = read_report(session, ["tiny"]).lines[0].runs
    assert values(older.metrics["val/toy-val/samples"]) == [6.0, 6.0, 6.0]
