"""Training with `report_to = ["tensorboard"]`: the event file holds every step's metrics as the database does."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.train.loop import train
from tests.train.conftest import tiny_config


def test_tensorboard_scalars_equal_the_run_metrics_rows(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the `report` extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(tiny_config(tmp_path, steps=2, report_to=["tensorboard"]), db=db, progress=False)
    assert result.steps == [1, 2]
    with db.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT step, name, value FROM run_metrics WHERE run_id = :r ORDER BY step, name"),
            {"r": result.run_id},
        ).all()
    stored: dict[int, dict[str, float]] = {1: {}, 2: {}}
    for step, name, value in rows:
        if value is not None:  # None is not logged (nor a number)
            stored[step][name] = value
    assert {step for step, _, _ in rows} == {1, 2} and all(len(v) > 20 for v in stored.values())

    folder = result.checkpoint_dir / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event, none sampled away
    events.Reload()
    logged: dict[int, dict[str, float]] = {1: {}, 2: {}}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            assert event.step in logged and tag not in logged[event.step], (tag, event.step)
            logged[event.step][tag] = event.value
    for step in (1, 2):
        assert sorted(logged[step]) == sorted(stored[step]), step
        for name, value in stored[step].items():  # TensorBoard keeps float32: the database's value, rounded so
            expected, got = float(np.float32(value)), logged[step][name]
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (step, name, got, value)
    assert {"reward/mean", "loss", "pool/summaries", "summary/generated", "time/step"} <= set(logged[2])
