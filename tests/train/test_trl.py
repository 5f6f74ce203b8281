"""lanpo's store inside TRL's GRPOTrainer (lanpo.integrations.trl), on the tiny random model and the real store.

- two TRL steps with feedback on: step 2's feedback groups carry contexts drawn from step 1's rows, lessons are
  admitted, no stored prompt carries a gold answer or a reward, the run finishes;
- p_t = 0 changes nothing: the same completion ids as plain TRL on the same seed, and the same loss (1e-6);
- a resume from a TRL checkpoint records no step twice;
- bad input is refused before training with nothing written;
- examples/trl/grpo.py on a fresh store: a later step's groups carry contexts from the store (and, on SmolLM2
  in the full lane, a lesson is kept).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.errors import LanpoError
from lanpo.feedback.config import FeedbackConfig, InterConfig
from lanpo.train.config import TrainConfig

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore")

from lanpo.integrations.trl import ID_KEY, TRLStore, check_layout  # noqa: E402

N = 2  # num_generations
PROBLEMS = 6
ROOT = Path(__file__).resolve().parents[2]
GOLD = "goldanswer"  # every gold answer holds it: a prompt that carries one is found by a substring search


def _problems(db: Engine) -> list[int]:
    rows = [
        Question(external_id=str(i), question=f"What is {i} + {i + 1}?", answer=f"{GOLD}{i}") for i in range(PROBLEMS)
    ]
    with transaction(db) as session:
        upsert_problems(session, "trl-toy", rows)
        session.connection().exec_driver_sql(
            "INSERT INTO relevance_scores (problem_id, candidate_problem_id, scorer, score) "
            "SELECT a.id, b.id, 'test', 0.95 FROM problems a JOIN problems b ON a.id <> b.id"
        )
        return problem_ids(session, "trl-toy")


def _plain(run_name: str, p_t: float) -> TrainConfig:
    from lanpo.train.config import DataConfig, SummarizerConfig

    return TrainConfig(
        run_name=run_name,
        seed=0,
        data=DataConfig(dataset="trl-toy"),
        feedback=FeedbackConfig(mode="both", p_t=p_t, k=2, candidates=4, inter=InterConfig(gamma=0.5, scorer="test")),
        # a random model never writes the lesson's headers: admit what it writes, so the pool fills
        summarizer=SummarizerConfig(min_reward=0.5, max_new_tokens=32, max_new_per_step=1, require_format=False),
    )


def _user_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """The user's own reward: 1 for the first completion of each group, 0 for the other (a spread in every group)."""
    return [float(i % N == 0) for i in range(len(completions))]


def _trainer(tmp_path: Path, dataset: Any, steps: int, store: TRLStore | None = None, record: list | None = None,
             **extra: Any) -> Any:  # fmt: skip
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from lanpo.models import load_causal_lm

    torch.manual_seed(0)
    model, tokenizer = load_causal_lm("tiny-random", dtype="float32", device="cpu")
    model.config._name_or_path = "tiny-random"  # what from_pretrained sets: the run's model

    def recorded(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        if record is not None:
            record.append([list(ids) for ids in completion_ids])
        return _user_reward(completions)

    eval_dataset = extra.pop("eval_dataset", None)
    hooks: dict[str, Any] = {} if eval_dataset is None else {"eval_dataset": eval_dataset}
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), max_steps=steps, per_device_train_batch_size=3 * N, num_generations=N,
        max_completion_length=8, learning_rate=1e-3, use_cpu=True, report_to=[], logging_steps=1,
        save_strategy=extra.pop("save_strategy", "no"), save_steps=1, disable_tqdm=True, seed=0, beta=0.04,
        shuffle_dataset=False, **extra,
    )  # fmt: skip
    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    if store is not None:
        hooks.update(rollout_func=store.rollout_func, callbacks=[store.callback])
    return GRPOTrainer(
        model=model, processing_class=tokenizer, args=args, train_dataset=dataset, peft_config=peft,
        reward_funcs=store.reward(recorded) if store is not None else recorded, **hooks,
    )  # fmt: skip


def _run(db: Engine, name: str) -> Any:
    with db.connect() as conn:
        return conn.execute(sa.text("SELECT * FROM runs WHERE name = :n"), {"n": name}).one_or_none()


def test_two_steps_with_feedback_draw_step_one_rows(db: Engine, tmp_path: Path) -> None:
    _problems(db)
    store = TRLStore(_plain("trl", 1.0), db=db)
    trainer = _trainer(tmp_path, store.dataset(), steps=2, store=store, eval_dataset=store.dataset().select(range(3)),
                       eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=3 * N)  # fmt: skip
    seen: list[list[Any]] = []
    serve = store.rollout_func

    def recording(prompts: list[Any], trl_trainer: Any) -> dict[str, Any]:
        seen.append([(trl_trainer.model.training, p[-1][ID_KEY]) for p in prompts])
        return serve(prompts, trl_trainer)

    trainer.rollout_func = recording
    trainer.train()
    # TRL 1.16 hands the rollout function each prompt repeated num_generations times in a row (its docstring says
    # otherwise): 3 problems x N per training call; the evaluation calls come with model.training False
    train_calls = [call for call in seen if call[0][0]]
    assert len(train_calls) == 2 and len(seen) > 2
    for call in train_calls:
        ids = [pid for _, pid in call]
        assert len(ids) == 3 * N and all(ids[g * N : (g + 1) * N] == [ids[g * N]] * N for g in range(3))
    run = _run(db, "trl")
    assert run.status == "finished" and run.config["trainer"] == "trl"
    with db.connect() as conn:
        steps = conn.execute(sa.text("SELECT step FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": run.id})
        assert [s for (s,) in steps] == [1, 2]
        groups = conn.execute(
            sa.text("SELECT id, step, mode, prompt, problem_id FROM rollout_groups WHERE run_id = :r"), {"r": run.id}
        ).all()
        assert (
            len(groups) == 2 * 3
            and {g.mode for g in groups} <= {"zero_shot", "intra", "inter"}
            and all(
                conn.scalar(sa.text("SELECT count(*) FROM attempts WHERE group_id = :g"), {"g": g.id}) == N
                for g in groups
            )
        )
        admitted = conn.scalar(
            sa.text("SELECT count(*) FROM experiences WHERE run_id = :r AND step = 1"), {"r": run.id}
        )
        assert admitted >= 1  # lessons of step 1 joined the pool
        # every step-2 feedback group's context rows name step-1 attempts (intra) or lessons (inter)
        step2 = [g for g in groups if g.step == 2 and g.mode in ("intra", "inter")]
        assert step2, "step 2 served no feedback group"
        for g in step2:
            sources = conn.execute(
                sa.text(
                    "SELECT coalesce(ag.step, e.step) FROM group_contexts c "
                    "LEFT JOIN attempts a ON a.id = c.context_attempt_id "
                    "LEFT JOIN rollout_groups ag ON ag.id = a.group_id "
                    "LEFT JOIN experience_versions v ON v.id = c.experience_version_id "
                    "LEFT JOIN experiences e ON e.id = v.experience_id WHERE c.group_id = :g"
                ),
                {"g": g.id},
            ).all()
            assert sources and {s for (s,) in sources} == {1}, (g.mode, sources)
        answers = dict(conn.execute(sa.text("SELECT id, answer FROM problems WHERE dataset = 'trl-toy'")).all())
        for g in groups:  # leakage: no gold answer (any problem's), no reward or verdict, in any trained prompt
            assert GOLD not in g.prompt and answers[g.problem_id] not in g.prompt
            assert "reward" not in g.prompt.lower()
        metrics = dict(conn.execute(
            sa.text("SELECT name, value FROM run_metrics WHERE run_id = :r AND step = 2"), {"r": run.id}
        ).all())  # fmt: skip
        inter = [g for g in step2 if g.mode == "inter"]
        used = conn.scalar(
            sa.text("SELECT coalesce(sum(times_injected), 0) FROM experience_usage WHERE pool_id = :p"),
            {"p": run.pool_id},
        )
        assert used == N * sum(
            conn.scalar(sa.text("SELECT count(*) FROM group_contexts WHERE group_id = :g"), {"g": g.id}) for g in inter
        )
        [logged] = [h for h in trainer.state.log_history if h.get("step") == 2 and "loss" in h]
        assert metrics["loss"] == pytest.approx(logged["loss"]) and metrics["kl"] == pytest.approx(logged["kl"])
        assert (
            metrics["feedback/p_t"] == 1.0 and metrics["feedback/asked/intra"] + metrics["feedback/asked/inter"] == 6
        )
    with transaction(db) as session, pytest.raises(LanpoError, match="is a TRL run, not a lanpo train one"):
        from lanpo.train.run import open_run

        open_run(session, _plain("trl", 1.0), "tiny-random", resume=True)
    figures = _report_draws(db, tmp_path, "trl")  # lanpo report reads a TRL run as a native one
    assert {"reward.png", "feedback.png", "policy.png", "optimizer.png"} <= set(figures), figures


def _report_draws(db: Engine, tmp_path: Path, name: str) -> list[str]:
    from lanpo.report.build import read_report, write_report

    with transaction(db) as session:
        return write_report(read_report(session, [name]), tmp_path / "report").figures


def test_p_t_zero_changes_nothing(db: Engine, tmp_path: Path) -> None:
    """With feedback off the integration is invisible: plain TRL's completions and loss, bit for bit and 1e-6."""
    _problems(db)
    store = TRLStore(_plain("trl-off", 0.0), db=db)
    dataset = store.dataset()
    plain_ids: list = []
    plain = _trainer(tmp_path / "plain", dataset, steps=2, record=plain_ids)
    plain.train()
    with_ids: list = []
    ours = _trainer(tmp_path / "ours", dataset, steps=2, store=store, record=with_ids)
    ours.train()
    assert plain_ids == with_ids and len(with_ids) == 2
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (plain, ours)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], abs=1e-6)
    with db.connect() as conn:  # and it wrote the steps: every group zero-shot, the user's own prompt
        modes = conn.execute(
            sa.text(
                "SELECT DISTINCT mode, prompt_version FROM rollout_groups g JOIN runs r ON r.id = g.run_id "
                "WHERE r.name = 'trl-off'"
            )
        ).all()
    assert modes == [("zero_shot", "trl-user")]


def test_resume_from_a_trl_checkpoint_records_no_step_twice(db: Engine, tmp_path: Path) -> None:
    _problems(db)
    first = TRLStore(_plain("trl-resume", 1.0), db=db)
    _trainer(tmp_path, first.dataset(), steps=2, store=first, save_strategy="steps").train()
    run = _run(db, "trl-resume")
    with db.connect() as conn:
        before = conn.scalar(sa.text("SELECT max(id) FROM rollout_groups WHERE run_id = :r"), {"r": run.id})
    again = TRLStore(_plain("trl-resume", 1.0), db=db)
    resumed = _trainer(tmp_path, again.dataset(), steps=2, store=again, save_strategy="steps")
    resumed.train(resume_from_checkpoint=str(tmp_path / "trl" / "checkpoint-1"))
    with db.connect() as conn:
        steps = conn.execute(
            sa.text("SELECT step, checkpoint FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": run.id}
        ).all()
        per_step = dict(conn.execute(
            sa.text("SELECT step, count(*) FROM rollout_groups WHERE run_id = :r GROUP BY step"), {"r": run.id}
        ).all())  # fmt: skip
        newest = conn.scalar(
            sa.text("SELECT min(id) FROM rollout_groups WHERE run_id = :r AND step = 2"), {"r": run.id}
        )
        status = conn.scalar(sa.text("SELECT status FROM runs WHERE id = :r"), {"r": run.id})
    assert [s for s, _ in steps] == [1, 2] and per_step == {1: 3, 2: 3}
    assert steps[0][1].endswith("checkpoint-1") and steps[1][1].endswith("checkpoint-2")
    assert newest > before  # step 2 is the replay's, recorded once; step 1 is the first run's
    assert status == "finished"


def _refused(db: Engine, tmp_path: Path, store: TRLStore, dataset: Any, needle: str) -> None:
    runs_before = _count(db, "runs")
    trainer = _trainer(tmp_path, dataset, steps=1, store=store)
    with pytest.raises(LanpoError, match=needle):
        trainer.train()
    assert _count(db, "runs") == runs_before and _count(db, "rollout_groups") == 0


def _count(db: Engine, table: str) -> int:
    with db.connect() as conn:
        return int(conn.scalar(sa.text(f"SELECT count(*) FROM {table}")))


def test_bad_input_is_refused_before_training_with_nothing_written(db: Engine, tmp_path: Path) -> None:
    from datasets import Dataset

    from lanpo.db import migrate
    from lanpo.db.repo import runs as runs_repo

    _problems(db)
    store = TRLStore(_plain("trl-bad", 1.0), db=db)
    # a prompt that names no stored problem
    rows = store.dataset().to_list()
    rows[3]["prompt"] = [{"role": "user", "content": "What is the capital of France?", ID_KEY: None}]
    _refused(db, tmp_path, store, Dataset.from_list(rows), "names no problem")
    # a run name a native lanpo run holds; a TRL run of another model
    with transaction(db) as session:
        runs_repo.create_run(session, "native", "train", {"run_name": "native"}, "tiny-random")
        runs_repo.create_run(session, "other-model", "train", {"trainer": "trl"}, "some/other-model")
    _refused(db, tmp_path, TRLStore(_plain("native", 1.0), db=db), store.dataset(), "not a TRL one")
    _refused(db, tmp_path, TRLStore(_plain("other-model", 1.0), db=db), store.dataset(), "not tiny-random")
    # the store's reward wrapper beside another reward function (the stored rewards would not be TRL's)
    beside = _trainer(tmp_path, store.dataset(), steps=1, store=store)
    beside.reward_funcs.append(_user_reward)
    beside.reward_func_names.append("other")
    beside.reward_weights = torch.ones(2)
    runs_before = _count(db, "runs")
    with pytest.raises(LanpoError, match="alone"):
        beside.train()
    assert _count(db, "runs") == runs_before and _count(db, "rollout_groups") == 0
    # a layout whose groups straddle processes, and more than one process
    layout = dict(num_generations=4, per_device_train_batch_size=2, steps_per_generation=1, world_size=1)
    with pytest.raises(LanpoError, match="straddle"):
        check_layout(SimpleNamespace(**layout))
    with pytest.raises(LanpoError, match="one process"):
        check_layout(SimpleNamespace(**{**layout, "per_device_train_batch_size": 4, "world_size": 2}))
    # a store at an older schema revision
    migrate.downgrade(db, "0001")
    try:
        with pytest.raises(LanpoError, match="revision"):
            TRLStore(_plain("trl-old", 1.0), db=db)
    finally:
        migrate.upgrade(db)


# Per step of run 'trl': groups whose prompt carried an earlier attempt (intra) or a lesson (inter), lessons kept.
STORE_AT_WORK = """
SELECT g.step,
       count(DISTINCT c.group_id) FILTER (WHERE c.context_attempt_id IS NOT NULL) AS intra,
       count(DISTINCT c.group_id) FILTER (WHERE c.experience_version_id IS NOT NULL) AS inter,
       (SELECT count(*) FROM pool_current p WHERE p.run_id = g.run_id AND p.step = g.step) AS kept
FROM rollout_groups g JOIN runs r ON r.id = g.run_id LEFT JOIN group_contexts c ON c.group_id = g.id
WHERE r.name = 'trl' GROUP BY g.run_id, g.step ORDER BY g.step
"""


def _example(pg_url: str, home: Path, *args: str) -> tuple[Any, list[Any], str]:
    """examples/trl/grpo.py run as a new user runs it: a fresh LANPO_HOME and an empty database, no `lanpo db
    upgrade` first (the store is migrated on open); (the finished process, STORE_AT_WORK's rows, run trl's status)."""
    import subprocess
    import sys

    from tests.fresh_store import fresh_store

    command = [sys.executable, str(ROOT / "examples/trl/grpo.py"), *args]
    with fresh_store(pg_url, home) as env:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        db = sa.create_engine(env["LANPO_DATABASE_URL"], poolclass=sa.pool.NullPool)
        with db.connect() as conn:
            rows = conn.execute(sa.text(STORE_AT_WORK)).all()
            status = conn.scalar(sa.text("SELECT status FROM runs WHERE name = 'trl'"))
        db.dispose()
    return done, rows, status


def test_mel_and_replay_recipes_are_refused_before_anything_is_written(db: Engine) -> None:
    """TRL's GRPOTrainer computes one loss over the completions its rollout_func returns: MEL's second loss and
    replay's stored rows have no place in it, and a recipe asking for them is refused, not run without them."""
    from dataclasses import replace

    from lanpo.errors import ConfigError
    from lanpo.feedback.replay_config import ReplayConfig

    _problems(db)
    plain = _plain("trl-refused", 1.0)
    with pytest.raises(ConfigError, match="the recipe is MEL"):
        TRLStore(replace(plain, method="mel"), db=db)
    with pytest.raises(ConfigError, match=r"enables \[replay\]"):
        TRLStore(replace(plain, replay=ReplayConfig(enabled=True)), db=db)
    assert _count(db, "runs") == 0


def test_docs_first_command_runs_on_a_fresh_store(pg_url: str, tmp_path: Path) -> None:
    """docs/trl.md's first command on the tiny model: both TRL steps land in the store, committed, and step 2's
    groups carry the model's step-1 attempts from the store (the example's four problems recur every step); the
    summary names them. The twin, on SmolLM2, of test_smollm2_example_keeps_a_lesson."""
    done, rows, status = _example(pg_url, tmp_path / "home", "--model", "tiny-random", "--max-steps", "2")
    assert [r.step for r in rows] == [1, 2] and status == "finished"
    assert rows[0].intra == rows[0].inter == 0 and rows[1].intra > 0  # step 1 had no history to draw
    assert "run trl: 2 TRL steps in the store" in done.stdout
    assert "groups with contexts from the store, and lessons kept, per step" in done.stdout
    assert "warm start: " in done.stdout  # the recipe's [sft]


# The full lane (bash .ci/run --full). Its twin in the main lane, test_docs_first_command_runs_on_a_fresh_store, runs
# the same script on the tiny model and asserts the intra contexts of step 2; what only this one reads is a lesson
# the real model wrote after its warm start, kept in the pool.
@pytest.mark.full
@pytest.mark.slow
@pytest.mark.long("SmolLM2's SFT warm start and three TRL steps of 4 x 4 rollouts with lessons, as docs/trl.md runs")
def test_smollm2_example_keeps_a_lesson(pg_url: str, tmp_path: Path) -> None:
    """docs/trl.md's command on its defaults: a later step's groups carry contexts from the store, and a lesson is
    kept in the pool."""
    done, rows, status = _example(pg_url, tmp_path / "home", "--max-steps", "3")
    assert [r.step for r in rows] == [1, 2, 3] and status == "finished"
    assert any(r.intra + r.inter > 0 for r in rows[1:])
    assert sum(r.kept for r in rows) >= 1, done.stdout[-3000:]
