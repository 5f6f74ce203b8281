"""Live logging: TensorBoard event files written offline; wandb only when installed and configured."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from lanpo.errors import ConfigError
from lanpo.report.live import MetricsLogger, check_report_to, wandb_configured


def test_tensorboard_event_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the `report` extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(["tensorboard"], "tb-run", tmp_path) as logger:
        logger.log(1, {"reward/mean": 0.25, "loss": math.nan, "skipped": None})
        logger.log(2, {"reward/mean": 0.5})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert sorted(accumulator.Tags()["scalars"]) == ["loss", "reward/mean"]
    assert [(e.step, e.value) for e in accumulator.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]


def test_report_to_is_checked() -> None:
    assert check_report_to(["tensorboard", "tensorboard"]) == ["tensorboard"]
    with pytest.raises(ConfigError, match="report_to must name backends among tensorboard, wandb, got 'mlflow'"):
        check_report_to(["mlflow"])
    MetricsLogger([], "none", "/nonexistent").log(1, {"x": 1.0})  # nothing asked: nothing written, nothing fails


def test_tensorboard_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # an import of it raises ImportError
    with pytest.raises(ConfigError, match="tensorboard package is not installed") as error:
        MetricsLogger(["tensorboard"], "r", tmp_path)
    assert "lanpo[report]" in (error.value.hint or "")


def test_wandb_missing_or_not_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="wandb is not installed"):
        MetricsLogger(["wandb"], "r", tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))
    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    with pytest.raises(ConfigError, match="wandb is not configured") as error:
        MetricsLogger(["wandb"], "r", tmp_path)
    assert "WANDB_MODE=offline" in (error.value.hint or "")


def test_wandb_configured_by_key_mode_or_netrc(tmp_path: Path) -> None:
    assert wandb_configured({"WANDB_API_KEY": "k"}, tmp_path / "none")
    assert wandb_configured({"WANDB_MODE": "offline"}, tmp_path / "none")
    assert not wandb_configured({"WANDB_MODE": "online"}, tmp_path / "none")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    assert wandb_configured({}, netrc)


def test_wandb_receives_each_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With wandb importable and configured, the run is created once, logged per step and finished."""
    calls: list[tuple[str, Any]] = []

    class FakeRun:
        def log(self, data: dict[str, float], step: int) -> None:
            calls.append(("log", (step, data)))

        def finish(self) -> None:
            calls.append(("finish", None))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "proj")
    with MetricsLogger(["wandb"], "w-run", tmp_path, config={"seed": 3}) as logger:
        logger.log(4, {"reward/mean": 1.0, "kl": math.inf})
    assert calls == [
        ("init", {"project": "proj", "name": "w-run", "config": {"seed": 3}, "dir": str(tmp_path)}),
        ("log", (4, {"reward/mean": 1.0})),
        ("finish", None),
    ]
