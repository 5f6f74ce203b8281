"""The Table 1-shaped results against a hand computation, read from a real store as the report reads them."""

from __future__ import annotations

import csv
import io
import statistics

import pytest
from sqlalchemy.orm import Session

from lanpo.report.build import read_report
from lanpo.report.series import Line, RunData, RunInfo, Series
from lanpo.report.table import AVERAGE, Stat, result_table
from tests.report.helpers import DATASETS, FINAL, SEEDS, START, fill_experiment


def by_hand(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values)


def test_table_equals_the_hand_computation(session: Session) -> None:
    fill_experiment(session)
    data = read_report(session, ["exp"])
    assert [line.label for line in data.lines] == ["grpo", "lanpo-both"]  # the baseline first
    table = result_table(data.lines, data.baselines)
    assert table.datasets == list(DATASETS) and table.ks == {"gsm": 4, "math": 4}
    rows = {r.label: r for r in table.rows}
    for arm in ("grpo", "lanpo-both"):
        row = rows[arm]
        for dataset in DATASETS:
            assert (row.final[dataset].mean, row.final[dataset].std) == pytest.approx(by_hand(FINAL[(arm, dataset)]))
            assert row.start[dataset].mean == pytest.approx(statistics.fmean(START[dataset]))
        per_seed = [statistics.fmean(FINAL[(arm, d)][i] for d in DATASETS) for i in range(len(SEEDS))]
        assert (row.final[AVERAGE].mean, row.final[AVERAGE].std) == pytest.approx(by_hand(per_seed))
        assert row.final_steps == (4, 4, 4)
    diff = rows["lanpo-both"].diff
    assert rows["grpo"].diff == {} and rows["lanpo-both"].baseline == "grpo"
    for dataset in DATASETS:
        pairs = [x - y for x, y in zip(FINAL[("lanpo-both", dataset)], FINAL[("grpo", dataset)], strict=True)]
        assert (diff[dataset].mean, diff[dataset].std, diff[dataset].n) == pytest.approx((*by_hand(pairs), 3))
    assert diff[AVERAGE].mean == pytest.approx((0.10 + 0.025 + 0.13) / 3)

    markdown = table.to_markdown("final")
    assert "| lanpo-both | 3 | 55.0 ± 5.0 | 32.0 ± 3.5 | 43.5 ± 4.1 |" in markdown
    assert "| lanpo-both − grpo | 3 | +10.0 ± 5.0 | +7.0 ± 6.1 | +8.5 ± 5.4 |" in table.to_markdown("diff")
    cells = {(r["table"], r["row"], r["column"]): r for r in csv.DictReader(io.StringIO(table.to_csv()))}
    math_row = cells[("final", "lanpo-both", "math")]
    assert (math_row["mean"], math_row["std"], math_row["n"], math_row["k"]) == ("0.320000", "0.034641", "3", "4")
    assert math_row["values"] == "0.300000;0.300000;0.360000" and math_row["steps"] == "4;4;4"
    assert cells[("diff", "lanpo-both", AVERAGE)]["baseline"] == "grpo"


def run(name: str, seed: int | None, values: dict[str, dict[int, float]], arm: str = "a") -> RunData:
    metrics = {f"val/{d}/mean@4": Series.of(list(v), list(v.values())) for d, v in values.items()}
    return RunData(RunInfo(seed or 0, name, "train", "running", experiment="e", arm=arm, seed=seed), metrics)


def test_incomplete_rows_and_unpaired_seeds() -> None:
    """A run missing a dataset has no Average; only seeds both arms ran exactly once are paired."""
    base = Line("grpo", [run("g0", 0, {"x": {0: 0.1, 4: 0.5}, "y": {4: 0.2}}), run("g1", 1, {"x": {4: 0.7}})], "e")
    other = Line("lanpo", [run("l0", 0, {"x": {0: 0.1, 3: 0.6, 5: float("nan")}, "y": {3: 0.3}})], "e")
    twice = Line("dup", [run("d0", 0, {"x": {4: 0.9}}), run("d0b", 0, {"x": {4: 0.1}})], "e")
    table = result_table([base, other, twice], {"e": base})
    rows = {r.label: r for r in table.rows}
    assert rows["grpo"].final[AVERAGE] == Stat((0.35,))  # g1 has no y: only g0's average
    assert rows["grpo"].final["x"] == Stat((0.5, 0.7)) and rows["grpo"].start == {"x": Stat((0.1,))}
    assert rows["lanpo"].final["x"].values == (0.6,) and rows["lanpo"].final_steps == (3,)  # NaN at 5 is skipped
    assert rows["lanpo"].diff["x"].values == pytest.approx((0.1,)) and rows["lanpo"].diff["x"].std is None
    assert rows["dup"].diff == {}
    assert "| lanpo | 1 | 60.0 | 30.0 | 45.0 |" in table.to_markdown("final")
    assert "| dup − grpo |" not in table.to_markdown("diff")


def test_no_validation_gives_an_empty_table() -> None:
    line = Line("r", [RunData(RunInfo(1, "r", "train", "running"), {"loss": Series.of([1], [0.5])})])
    table = result_table([line], {})
    assert table.datasets == [] and table.to_markdown("final") == "" and table.to_csv().count("\n") == 1
