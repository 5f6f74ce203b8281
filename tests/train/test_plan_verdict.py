"""`lanpo plan`'s verdict (lanpo.train.plan_verdict): fits only with the plan's measured error to spare, tight
below it, refused over the GPU; and the measured error itself, held to the measurements docs/scaling.md records.

The measured peaks in docs/scaling.md's plan-check tables are facts of a run (bench/plan_check.py on a CPU and on an
H200); the predictions are the plan's, so they are recomputed here from today's `make_plan`: a change of the plan
shows in the tables (the predicted column must be regenerated) and in `WORST_RATIO` (the verdict's margin), never
silently.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from lanpo.cli import main
from lanpo.train.config import load_config
from lanpo.train.plan import make_plan
from lanpo.train.plan_shapes import model_shape
from lanpo.train.plan_verdict import WORST_RATIO, is_safe, margin, verdict_word

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "train" / "configs" / "grpo-baseline.toml"


def _plan_check() -> Any:
    spec = importlib.util.spec_from_file_location("plan_check", ROOT / "bench" / "plan_check.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["plan_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def documented_rows(device: str) -> list[dict[str, str]]:
    """The rows of the plan-check table docs/scaling.md records for `device` (after `<!-- plan-check DEVICE -->`)."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    marker = f"<!-- plan-check {device} -->"
    assert marker in text, f"docs/scaling.md has no {marker} table"
    lines = text.split(marker, 1)[1].strip().splitlines()
    table = [line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("|"))]]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True)) for row in table[2:]]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_documented_predictions_are_todays_plan(device: str) -> None:
    """Each documented case's predicted MiB is what the plan says now, and its ratio is that over the measure."""
    bench = _plan_check()
    rows = documented_rows(device)
    assert rows
    for row in rows:
        case = bench.ALL_CASES[row["case"]]
        predicted = bench.predicted(case, device) / 2**20
        measured = float(row["measured MiB"].replace(",", ""))
        assert float(row["predicted MiB"].replace(",", "")) == pytest.approx(predicted, abs=0.5), (
            f"{device} {row['case']}: regenerate its predicted column ({predicted:,.0f} MiB now)"
        )
        assert float(row["ratio"]) == pytest.approx(predicted / measured, abs=0.005), row


def test_the_verdicts_margin_is_the_worst_measured_under_prediction() -> None:
    """WORST_RATIO is the lowest ratio of every documented case, on both machines (to 2 digits, rounded down)."""
    bench = _plan_check()
    ratios = []
    for device in ("cpu", "cuda"):
        for row in documented_rows(device):
            measured = float(row["measured MiB"].replace(",", ""))
            ratios.append(bench.predicted(bench.ALL_CASES[row["case"]], device) / 2**20 / measured)
    worst = min(ratios)
    assert worst - 0.01 < WORST_RATIO <= worst, f"set WORST_RATIO to {int(worst * 100) / 100:.2f}"


def test_fits_tight_and_does_not_fit_at_the_boundaries(capsys: pytest.CaptureFixture[str]) -> None:
    """The same plan on GPUs just above and below its peak / WORST_RATIO and its peak: fits, tight (exit 0 and the
    key to change), does not fit (exit 2, one error line)."""
    cfg = load_config(RECIPE, [])
    shape = model_shape(cfg.model.name)

    def memory_where(accepts: Any) -> float:  # the engine's share scales with the GPU: bisect for each boundary
        lo, hi = 1.0, 4096.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if accepts(make_plan(cfg, shape, 8, mid)) else (mid, hi)
        return hi

    safe_at = memory_where(is_safe)
    fits_at = memory_where(lambda p: p.fits)
    assert fits_at < safe_at
    cases = ((safe_at * 1.001, "fits", 0), (safe_at * 0.999, "tight", 0), (fits_at * 0.999, "does not fit", 2))
    for memory, word, status in cases:
        plan = make_plan(cfg, shape, 8, memory)
        assert verdict_word(plan) == word
        if word == "fits":
            assert margin(plan) >= 1 - WORST_RATIO
        got = main(["plan", "--config", str(RECIPE), "--gpus", "8", "--gpu-memory", f"{memory:.6f}"])
        out, err = capsys.readouterr()
        assert got == status, out + err
        assert f"verdict: {word} (" in out
        hints = [line for line in (out + err).splitlines() if line.strip().startswith("hint:")]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if word == "fits":
            assert not hints and not errors
        elif word == "tight":
            assert len(hints) == 1 and "under-count" in hints[0] and not errors, out + err
        else:
            assert len(errors) == 1 and len(hints) == 1, err
        assert "Traceback" not in out + err


def test_the_verdict_prints_the_margin_and_what_it_needs() -> None:
    cfg = load_config(RECIPE, [])
    plan = make_plan(cfg, model_shape(cfg.model.name), 8, 139.0)
    from lanpo.train.plan_verdict import verdict

    said = verdict(plan)
    assert re.search(r"\d+% to spare, \d+% needed for the plan's measured error", said), said
