"""`lanpo report` end to end on a real store: every PNG opens and has content, report.md embeds it; clean errors."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from PIL import Image
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from lanpo.train.loop import train
from tests.report.helpers import fill_experiment, make_experiment, make_run, write_run
from tests.train.conftest import tiny_config

VALIDATION = {"validation", "validation_tokens", "validation_time", "validation_detail", "matched_budget"}
ALWAYS = {
    "reward",
    "accuracy",
    *VALIDATION,
    "response_length",
    "policy",
    "optimizer",
    "feedback",
    "use",
    "pool",
    "time",
}


def assert_has_content(path: Path) -> None:
    """A PNG of a sensible size whose pixels are not all one colour (something was drawn)."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
        assert 400 <= width <= 2000 and 300 <= height <= 2000, image.size
        rgb = image.convert("RGB")
        colours = len(rgb.getcolors(width * height))  # PIL's count (np.unique over rows took seconds a figure)
        pixels = np.asarray(rgb, dtype=np.int16)
    background = pixels[0, 0]
    differs = np.abs(pixels - background).sum(axis=2) > 30
    assert differs.mean() > 0.02, f"{path.name}: only {differs.mean():.3%} of its pixels are drawn"
    assert colours > 20, f"{path.name}: too few colours to be a plot"


def test_experiment_report(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    fill_experiment(session)
    out = tmp_path / "reports" / "exp"
    result = run_cli("report", "exp", "--out", out)
    assert result.code == 0, result.err
    figures = {p.stem for p in out.glob("*.png")}
    assert figures == ALWAYS  # mel and engine: not recorded by these runs
    for png in out.glob("*.png"):
        assert_has_content(png)
    report = (out / "report.md").read_text()
    assert report.startswith("<!-- lanpo report -->\n# lanpo report: exp")
    embedded = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert sorted(embedded) == sorted(f"{name}.png" for name in figures)
    assert "| method | seeds | gsm | math | Average |" in report
    assert "| grpo | 3 | 45.0 ± 5.0 | 25.0 ± 5.0 | 35.0 ± 5.0 |" in report  # baseline first
    assert "| Average | generated tokens | training minutes |" in report  # what the accuracy cost, beside it
    assert "| lanpo-both − grpo | 3 | +10.0 ± 5.0 | +7.0 ± 6.1 | +8.5 ± 5.4 |" in report
    assert "min–max over seeds" in report
    assert "- Meta-experience learning (`mel.png`, from mel/*): not recorded by these runs." in report
    assert "- Rollout engine (`engine.png`, from engine/*): not recorded by these runs." in report
    rows = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert {r["table"] for r in rows} == {"final", "start", "diff"}
    written = [*(f"{f}.png" for f in figures), "report.md", "table.csv", "matched_budget.csv"]
    assert sorted(p.name for p in out.iterdir()) == sorted(written)
    assert "| grpo | 3 |" in result.out and str(out) in result.out
    assert not list(out.parent.glob(".*")), "a staging folder was left behind"


def test_runs_overlaid_and_missing_panels_named(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    """Two plain runs, one row each; no validation and no intra/inter rollouts: said so in report.md."""
    for name, seed in (("a", 0), ("b", 1)):
        run_id = make_run(session, name, seed, mode="none")
        write_run(session, run_id, "grpo", seed, "none")
        session.execute(sa.text("DELETE FROM run_metrics WHERE run_id = :r AND name LIKE 'val/%'"), {"r": run_id})
    session.commit()
    out = tmp_path / "ab"
    result = run_cli("report", "a", "run:b", "--out", out)
    assert result.code == 0, result.err
    report = (out / "report.md").read_text()
    assert "# lanpo report: a, b" in report
    assert "No validation was recorded by these runs" in report
    assert "- Validation mean@k (`validation.png`, from val/<dataset>/mean@<k>): not recorded by these runs." in report
    assert "Panels left out, not recorded by these runs: intra (reward/intra); inter (reward/inter)." in report
    # no rollout had a context: of the use diagnostics, zero-shot's answer-only rate alone is drawn
    assert "### Do the answers use their context" in report
    assert (
        "Panels left out, not recorded by these runs: followed the prompt's sections (use/sections/intra, " in report
    )
    assert not (out / "validation.png").exists()
    for png in out.glob("*.png"):
        assert_has_content(png)


def test_single_run_table_has_one_row(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    ids = fill_experiment(session)
    run = session.scalar(sa.text("SELECT name FROM runs WHERE id = :i"), {"i": ids[("lanpo-both", 1)]})
    result = run_cli("report", run, "--out", tmp_path / "one")
    assert result.code == 0, result.err
    report = (tmp_path / "one" / "report.md").read_text()
    assert f"| {run} | 1 | 55.0 | 30.0 | 42.5 |" in report
    assert "| 1 | 11.0 | 5.0 | 8.0 |" in report  # step 0
    assert "Paired difference" not in report and "shaded band" not in report


def test_replaces_an_earlier_report_whole(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    fill_experiment(session)
    out = tmp_path / "r"
    assert run_cli("report", "exp", "--out", out).code == 0
    (out / "stale.png").write_bytes(b"from an earlier report")
    assert run_cli("report", "exp", "--out", out, "--band", "std").code == 0
    assert not (out / "stale.png").exists()
    assert "±1 std over seeds" in (out / "report.md").read_text()


def assert_clean_error(result: Any, says: str) -> None:
    assert result.code == 2, result.out + result.err
    assert "Traceback" not in result.err
    assert f"error: {says}" in result.err, result.err
    assert "\n  hint: " in result.err, result.err


def test_unknown_and_ambiguous_names(run_cli: Callable[..., Any], session: Session, tmp_path: Path) -> None:
    fill_experiment(session)
    make_run(session, "twin")
    make_experiment(session, "twin")
    session.commit()
    out = tmp_path / "out"
    unknown = run_cli("report", "exq", "--out", out)
    assert_clean_error(unknown, "no run or experiment named 'exq'")
    assert (
        "did you mean exp?" in unknown.err and "experiments: twin, exp" in unknown.err and "runs: twin," in unknown.err
    )
    ambiguous = run_cli("report", "twin", "--out", out)
    assert_clean_error(ambiguous, "'twin' names both a run and an experiment")
    assert "say which: run:twin or experiment:twin" in ambiguous.err
    assert_clean_error(run_cli("report", "experiment:twin", "--out", out), "experiment 'twin' has no runs yet")
    assert_clean_error(run_cli("report", "run:twin", "--out", out), "twin: no metrics recorded yet")
    assert_clean_error(run_cli("report", "exp", "--baseline", "nosuch", "--out", out), "experiment 'exp' has no arm")
    assert_clean_error(run_cli("report", "exp-grpo-s0", "--baseline", "grpo", "--out", out), "--baseline names an arm")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert_clean_error(run_cli("report", "exp", "--out", tmp_path / "mine"), f"--out {tmp_path / 'mine'} holds files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nothing written, not even the --out folder


def test_failure_while_drawing_leaves_nothing(
    run_cli: Callable[..., Any], session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_experiment(session)
    out = tmp_path / "new" / "report"
    assert run_cli("report", "exp", "--out", tmp_path / "old").code == 0
    before = sorted(p.name for p in (tmp_path / "old").iterdir())
    from lanpo.report import plot

    calls = []

    def fail_on_third(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    real = plot.draw
    monkeypatch.setattr(plot, "draw", fail_on_third)
    failed = run_cli("report", "exp", "--out", out)
    assert_clean_error(failed, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    calls.clear()
    assert run_cli("report", "exp", "--out", tmp_path / "old").code == 2
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == before  # the earlier report is untouched


def test_report_of_a_real_tiny_training_run(
    run_cli: Callable[..., Any], db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    """The trainer's own metrics: every one of them lands in some figure, and every figure has content."""
    train(tiny_config(tmp_path, steps=2), db=db, progress=False)
    result = run_cli("report", "tiny", "--out", tmp_path / "tiny-report")
    assert result.code == 0, result.err
    out = tmp_path / "tiny-report"
    assert {p.stem for p in out.glob("*.png")} >= ALWAYS - VALIDATION
    for png in out.glob("*.png"):
        assert_has_content(png)
    assert "Recorded but in no figure" not in (out / "report.md").read_text()
    with db.connect() as conn:  # step 1: no history yet, zero-shot; step 2: every prompt served feedback (p_t = 1)
        uses = conn.execute(sa.text("SELECT DISTINCT step, mode FROM use_diagnostics WHERE run_name = 'tiny'")).all()
    assert (1, "zero_shot") in uses and {m for s, m in uses if s == 2} & {"intra", "inter"}, uses
