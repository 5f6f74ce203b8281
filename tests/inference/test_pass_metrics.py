"""MEL's evaluation metrics in `lanpo eval`: Pass@1 from a greedy pass (its own eval run), Avg@k and Pass@k from
the sampled one, in a second table next to the unchanged mean@k table, counted from the stored attempts."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.orm import Session

from lanpo.inference.answerer import Answerer
from lanpo.inference.evaluate import run_eval
from lanpo.inference.table import Cell, Table
from lanpo.rollout import Completion, SamplingParams

from .conftest import ScriptedBackend
from .test_evaluate import config, eval_file


class RecordingBackend(ScriptedBackend):
    """The scripted model, noting the temperature of every call (greedy calls answer as sample 0)."""

    temperatures: list[float]

    def generate(self, prompts: list[str], n: int, params: SamplingParams) -> list[list[Completion]]:
        self.temperatures = [*getattr(self, "temperatures", []), params.temperature]
        return super().generate(prompts, n, params)


def test_pass_at_1_avg_and_pass_at_k(
    tmp_path: Path, db: SAEngine, make_answerer: Callable[..., Answerer], session: Session
) -> None:
    eval_file(tmp_path, range(6))  # question q: sample j is right when (q + j) % 3 == 0
    answerer = make_answerer()
    answerer.backend = backend = RecordingBackend(answerer.tokenizer)
    cfg = config(
        tmp_path, datasets=[{"name": "gsm", "file": "gsm.jsonl"}], modes=["zero_shot"], k_samples=3, pass_at_1=True
    )
    printed: list[str] = []
    result = run_eval(cfg, db, config_dir=tmp_path, answerer=answerer, echo=printed.append, show_progress=False)

    cell = result.table.cells[("zero_shot", "gsm")]
    assert cell.mean == pytest.approx(1 / 3) and cell.pass_at_k == 1.0  # Avg@3 and Pass@3: one right sample each
    assert result.computed.cells == result.table.cells  # the same counted in memory and in SQL
    assert result.greedy is not None and result.greedy.k == 1
    assert result.greedy.cells[("zero_shot", "gsm")].mean == pytest.approx(2 / 6)  # greedy: q = 0 and q = 3
    assert set(backend.temperatures) == {1.0, 0.0} and answerer.sampling.temperature == 1.0  # restored
    runs = session.execute(
        sa.text(
            "SELECT r.name, r.status, count(a.attempt_id) FROM runs r JOIN run_attempts a ON a.run_id = r.id "
            "GROUP BY r.name, r.status ORDER BY r.name"
        )
    ).all()
    assert [tuple(r) for r in runs] == [("eval-test", "finished", 18), ("eval-test-greedy", "finished", 6)]
    metrics = dict(
        session.execute(sa.text("SELECT name, value FROM run_metrics WHERE run_id = :r"), {"r": result.run_id}).all()
    )
    assert metrics["pass@1/zero_shot/gsm"] == pytest.approx(1 / 3) and metrics["pass@k/zero_shot/gsm"] == 1.0

    # the mean@k table is as before; MEL's table comes second, written to pass.md; table.csv carries both
    assert printed[0] == result.table.to_markdown() == result.markdown_path.read_text()
    passes = result.pass_path.read_text() if result.pass_path else ""
    assert printed[1] == passes
    lines = passes.splitlines()
    assert lines[0] == "| Pass@1 · Avg@3 · Pass@3 | gsm | Average |"
    assert lines[2:] == [
        "| Zero-shot Pass@1 (T=0) | 33.3 | 33.3 |",
        "| Zero-shot Avg@3 (T=1) | 33.3 | 33.3 |",
        "| Zero-shot Pass@3 (T=1) | 100.0 | 100.0 |",
    ]
    row = next(csv.DictReader(io.StringIO(result.csv_path.read_text())))
    assert (float(row["pass_at_k"]), float(row["pass_at_1"])) == (1.0, pytest.approx(1 / 3))


def test_pass_table_without_a_greedy_pass_and_with_missing_cells() -> None:
    table = Table(["zero_shot", "retrieval"], ["a", "b"], 8, {("zero_shot", "a"): Cell(0.5, 2, 16, 1.0)})
    rows = table.pass_rows(temperature=0.6)
    assert rows[0] == ["Pass@1 · Avg@8 · Pass@8", "a", "b", "Average"]
    assert rows[1:] == [
        ["Zero-shot Avg@8 (T=0.6)", "50.0", "-", "50.0"],
        ["Zero-shot Pass@8 (T=0.6)", "100.0", "-", "100.0"],
        ["Retrieval Avg@8 (T=0.6)", "-", "-", "-"],
        ["Retrieval Pass@8 (T=0.6)", "-", "-", "-"],
    ]
