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
                "summarizer.min_reward=0.0",  # every rollout is summarised: the format check turns each away
                "sft.max_steps=2",
                "sft.n_problems=4",
                "feedback.inter.gamma=0.0",
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
    assert len(out["answers"]) == 2 and all({"zero_shot", "retrieval"} <= set(a) for a in out["answers"])
    # stage 6: both modes side by side on the same problems, their accuracies, one line on what the store changed
    assert "zero-shot" in text and "accuracy on 2 held-out problems: zero-shot " in text
    verdict = out["answers"][0]["verdict"]
    assert verdict in text and verdict.startswith(("retrieval hurt", "retrieval did not help", "retrieval helped",
                                                   "no lesson reached"))  # fmt: skip
    # a random model writes no lesson: every summary it wrote was turned away, and the pool stayed empty
    summaries = out["summaries"]
    assert summaries["written"] > 0 and summaries["with_format"] == summaries["admitted"] == 0
    assert summaries["without_format"] + summaries["too_short"] == summaries["written"]
    assert f"summaries: {summaries['written']} written, 0 with the lesson format" in text
    assert verdict.startswith("no lesson reached")
    assert "lanpo sql" in text and "Demo finished" in text
    held = out["held_out"]
    assert held["metric"].endswith("/mean@2") and 0 <= held["before"] <= 1 and 0 <= held["after"] <= 1
    assert f"{held['before']:.3f} at step 0 -> {held['after']:.3f} at step 3" in text
    pngs = sorted(Path(out["report_dir"]).glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs) and (Path(out["report_dir"]) / "report.md").is_file()
    with db.connect() as conn:
        kinds = dict(conn.execute(sa.text("SELECT name, kind FROM runs")).all())
        statuses = dict(conn.execute(sa.text("SELECT name, status FROM runs")).all())
        committed = conn.scalar(
            sa.text("SELECT max(step) FROM run_steps JOIN runs ON runs.id = run_id WHERE name = 'demo-test'")
        )
        scored = conn.scalar(sa.text("SELECT count(*) FROM relevance_scores"))
        infer_attempts = dict(
            conn.execute(
                sa.text(
                    "SELECT mode, count(*) FROM run_attempts JOIN runs ON runs.id = run_id "
                    "WHERE runs.kind = 'infer' AND step = 0 GROUP BY mode"
                )
            ).all()
        )
        experiences = conn.scalar(sa.text("SELECT count(*) FROM experiences e JOIN runs r ON r.id = e.run_id"))
    assert kinds["demo-test"] == "train" and kinds["demo-test-infer"] == "infer"
    assert set(statuses.values()) == {"finished"}, statuses  # nothing the demo made reads as lost (`lanpo runs`)
    assert committed == 3
    assert scored > 0
    assert infer_attempts == {"zero_shot": 2, "retrieval": 2}  # one run, the same step: experience_usage pairs them
    assert experiences == 0
    assert Path(out["checkpoint_dir"]).is_dir()


def test_demo_needs_a_task_to_generate_problems(db_env: str, tmp_path: Path) -> None:
    from lanpo.errors import InputError

    config = tmp_path / "no-task.toml"
    config.write_text('[data]\ndataset = "x"\n')
    with pytest.raises(InputError, match=r"data\.task"):
        run_demo(DemoOptions(config=config, n_train=2), echo=lambda _: None)


def test_the_verdict_compares_the_accuracies_honestly() -> None:
    from lanpo.demo import retrieval_verdict

    hurt = retrieval_verdict([True, True, False, False], [False, False, False, False], 4, "smollm2")
    assert hurt.startswith("retrieval hurt at this model size (smollm2): 0% with lessons against 50% without")
    assert "0 answer(s) fixed, 2 broken" in hurt and "within noise" in hurt  # 4 problems: 2 is not beyond noise
    clear = retrieval_verdict([True] * 40, [False] * 40, 40, "smollm2")
    assert clear.startswith("retrieval hurt") and "beyond noise" in clear
    same = retrieval_verdict([True, False], [False, True], 2, "m")
    assert same == (
        "retrieval did not help at this model size (m): 50% with lessons against 50% without; "
        "1 answer(s) fixed, 1 broken"
    )
    assert retrieval_verdict([False, False], [True, False], 1, "m").startswith("retrieval helped (m): 50% with")
    assert retrieval_verdict([False], [False], 0, "m").startswith("no lesson reached these problems")
    assert retrieval_verdict([], [], 0, "m") == "no held-out problems: nothing to compare"
