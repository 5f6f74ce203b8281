"""`lanpo demo` end to end on a tiny random model: every stage runs against the real store and leaves its rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.demo import DemoOptions, recipe_path, run_demo
from lanpo.train.config import load_config
from tests.db.store_helpers import assert_planned_within_growth

GAMMA = 0.3  # > 0: relevance scores are read, and the tiny judge's scores must pass it


@pytest.mark.usefixtures("fresh_statistics")  # it asserts the planner's statistics
def test_demo_carries_lessons_from_the_pool_into_training_and_retrieval(
    db_env: str, db: Engine, tmp_path: Path, monkeypatch
) -> None:
    """The store at work on a tiny random model, with the recipe's scaffolded summariser, the format required and
    gamma > 0: a lesson admitted at step 1 reaches a step-2 inter prompt, and a stage-6 retrieval prompt, both
    named in `group_contexts`; `experience_usage` counts the retrieval use against its zero-shot baseline."""
    monkeypatch.setenv("LANPO_HOME", str(tmp_path))
    lines: list[str] = []
    out = run_demo(
        DemoOptions(
            config=recipe_path("demo-cpu.toml"),
            steps=3,
            n_train=4,
            n_test=2,
            run_name="demo-test",
            relevance_top_k=3,  # every other problem: every pair has a score
            overrides=(
                'model.name="tiny-random"',
                "batch_size=2",
                "rollout.max_new_tokens=8",
                "summarizer.max_new_tokens=96",  # 32 characters a section: a few words of two letters or more
                "summarizer.min_reward=0.0",  # a random model earns no reward: summarise every rollout
                "summarizer.max_total_per_step=4",
                "sft.max_steps=2",
                "sft.n_problems=4",
                'feedback.mode="inter"',
                "feedback.p_t=1.0",  # every prompt from step 2 on asks for lessons
                f"feedback.inter.gamma={GAMMA}",
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
    assert len(out["rewards"]) == 3 and "Demo finished" in text and "lanpo sql" in text
    cfg = load_config(recipe_path("demo-cpu.toml"))
    assert cfg.summarizer.scaffold and cfg.summarizer.require_format  # the recipe's own summariser
    assert cfg.store.retire_below == 0.0  # the demo retires a lesson whose lift is confidently below zero
    summaries = out["summaries"]
    assert summaries["admitted"] > 0 and summaries["with_format"] >= summaries["admitted"], text
    assert f"summaries: {summaries['written']} written, {summaries['with_format']} with the lesson format" in text
    with db.connect() as conn:
        run_id = conn.scalar(sa.text("SELECT id FROM runs WHERE name = 'demo-test'"))
        infer_id = conn.scalar(sa.text("SELECT id FROM runs WHERE name = 'demo-test-infer'"))
        statuses = dict(conn.execute(sa.text("SELECT name, status FROM runs")).all())
        step1 = {
            version: problem
            for version, problem in conn.execute(
                sa.text(
                    "SELECT v.id, e.problem_id FROM experiences e "
                    "JOIN experience_versions v ON v.experience_id = e.id "
                    "WHERE e.run_id = :run AND e.step = 1"
                ),
                {"run": run_id},
            )
        }

        def contexts(run: int, mode: str, step: int) -> list[tuple[int, int, int, float]]:
            """(group's problem, experience version, its source problem, score) of every lesson in a context."""
            return conn.execute(
                sa.text(
                    "SELECT g.problem_id, gc.experience_version_id, e.problem_id, gc.score FROM group_contexts gc "
                    "JOIN rollout_groups g ON g.id = gc.group_id "
                    "JOIN experience_versions v ON v.id = gc.experience_version_id "
                    "JOIN experiences e ON e.id = v.experience_id "
                    "WHERE g.run_id = :run AND g.mode = :mode AND g.step = :step"
                ),
                {"run": run, "mode": mode, "step": step},
            ).all()

        step2 = contexts(run_id, "inter", 2)
        retrieved = contexts(infer_id, "retrieval", 0)
        usage = conn.execute(
            sa.text(
                "SELECT version_id, times_injected, uses_with_baseline, zero_shot_accuracy FROM experience_usage "
                "WHERE version_id = ANY(:ids)"
            ),
            {"ids": [version for _, version, _, _ in retrieved]},
        ).all()
        scored = conn.scalar(sa.text("SELECT count(*) FROM relevance_scores"))
        held_out = set(conn.scalars(sa.text("SELECT id FROM problems WHERE dataset = 'chain_sum_easy-test'")))
    assert step1, "no lesson admitted at step 1"
    # a step-1 lesson in a step-2 inter prompt, of another problem, at a relevance that passed gamma
    carried = [row for row in step2 if row[1] in step1]
    assert carried, (step1, step2)
    assert all(group != source and score is not None and score >= GAMMA for group, _, source, score in step2)
    # stage 6, at the default stage 1 (BM25 alone): every held-out question's retrieval found the pool's lessons and
    # read them, named in their groups' contexts, and the demo shows them
    assert retrieved and all(score is not None and score >= GAMMA for *_, score in retrieved)
    assert {problem for problem, *_ in retrieved} == held_out  # each held-out problem read at least one lesson
    for _, version, source, _ in retrieved:
        assert f"read #{version} (of problem {source}):" in text
    assert out["answers"][0]["verdict"].startswith(("retrieval hurt", "retrieval did not help", "retrieval helped"))
    # experience_usage: each retrieval use counted, with the zero-shot answer to the same question as its baseline
    assert usage and all(
        times >= 1 and with_baseline >= 1 and zero is not None for _, times, with_baseline, zero in usage
    )
    assert set(statuses.values()) == {"finished"}, statuses  # nothing the demo made reads as lost (`lanpo runs`)
    assert scored > 0
    # every bulk write of the demo (its imports, relevance build, training steps, stage 6's answers) left the
    # planner its rows when the demo returned (lanpo.db.stats)
    tables = ("problems", "relevance_scores", "rollout_groups", "attempts", "group_contexts", "experiences")
    assert_planned_within_growth(db, *tables, "experience_versions")
    held = out["held_out"]
    assert held["metric"].endswith("/mean@2") and 0 <= held["before"] <= 1 and 0 <= held["after"] <= 1
    pngs = sorted(Path(out["report_dir"]).glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs) and (Path(out["report_dir"]) / "report.md").is_file()
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
