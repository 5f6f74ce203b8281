"""examples/verl/rollout_cpu.py's resume, without verl: the step after the newest checkpoint verl's tracker file
names, refused when the store's run has not checkpointed that far (the whole example runs in the verl lane)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("rollout_cpu", ROOT / "examples/verl/rollout_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _store(last_step: int | None) -> SimpleNamespace:
    run = SimpleNamespace(opened=SimpleNamespace(last_step=last_step))
    return SimpleNamespace(run=run, cfg=SimpleNamespace(run_name="verl-cpu"))


def test_resume_continues_after_the_trackers_checkpoint_that_the_store_holds(tmp_path: Path) -> None:
    example = _example()
    assert example.resume_step(tmp_path, _store(None)) == 1  # no checkpoint yet: from step 1
    for step in (1, 2):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / example.TRACKER).write_text("2\n")
    assert example.resume_step(tmp_path, _store(3)) == 3  # killed after step 3's callback, before its tracker
    with pytest.raises(SystemExit, match="has checkpointed step 1 only"):
        example.resume_step(tmp_path, _store(1))
    (tmp_path / example.TRACKER).write_text("4\n")
    with pytest.raises(SystemExit, match="global_step_4 is missing"):
        example.last_checkpoint(tmp_path)
