"""`lanpo demo` end to end on a tiny random model: every stage runs against the real store and leaves its rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.demo import DemoOptions, recipe_path, run_demo


def test_demo_runs_every_stage_on_a_tiny_model(db_env: str, db: Engine, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LANPO_HOME", str(tmp_path))
    lines: list[str] = []
    out = run_demo(
        DemoOptions(
            config=recipe_path("demo-cpu.toml"),
            steps=3,
            n_train=4,
            n_test=2,
            run_name="demo-test",
            relevance_top_k=2,
            overrides=(
                'model.name="tiny-random"',
                "batch_size=2",
                "rollout.max_new_tokens=8",
                "summarizer.max_new_tokens=8",
                "sft.max_steps=2",
                "sft.n_problems=4",
                "feedback.gamma=0.0",
                "eval.every=3",
                "eval.n=2",
                "eval.k=2",
            ),
        ),
        echo=lines.append,
    )
    text = "\n".join(lines)
    for number in range(1, 7):
        assert f"[{number}/6]" in text
    assert len(out["rewards"]) == 3
    assert len(out["answers"]) == 2
    assert "lanpo sql" in text and "Demo finished" in text
    held = out["held_out"]
    assert held["metric"].endswith("/mean@2") and 0 <= held["before"] <= 1 and 0 <= held["after"] <= 1
    assert f"{held['before']:.3f} at step 0 -> {held['after']:.3f} at step 3" in text
    pngs = sorted(Path(out["report_dir"]).glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs) and (Path(out["report_dir"]) / "report.md").is_file()
    with db.connect() as conn:
        kinds = dict(conn.execute(sa.text("SELECT name, kind FROM runs")).all())
        committed = conn.scalar(
            sa.text("SELECT max(step) FROM run_steps JOIN runs ON runs.id = run_id WHERE name = 'demo-test'")
        )
        scored = conn.scalar(sa.text("SELECT count(*) FROM relevance_scores"))
        infer_attempts = conn.scalar(
            sa.text("SELECT count(*) FROM run_attempts JOIN runs ON runs.id = run_id WHERE runs.kind = 'infer'")
        )
    assert kinds["demo-test"] == "train" and kinds["demo-test-infer"] == "infer"
    assert committed == 3
    assert scored > 0
    assert infer_attempts == 2
    assert Path(out["checkpoint_dir"]).is_dir()


def test_demo_needs_a_task_to_generate_problems(db_env: str, tmp_path: Path) -> None:
    from lanpo.errors import InputError

    config = tmp_path / "no-task.toml"
    config.write_text('[data]\ndataset = "x"\n')
    with pytest.raises(InputError, match=r"data\.task"):
        run_demo(DemoOptions(config=config, n_train=2), echo=lambda _: None)
