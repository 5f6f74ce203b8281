"""lanpo's store as the verl integration reads and writes it (lanpo.integrations.verl.store and .process, which
import no verl), on the real store and a real tokenizer, each group written as a worker writes it (draw, grade,
write_group):

- the `lanpo:` section and the recipe: what is refused (no recipe, a bad reward, MEL, lessons by another model)
  and what verl sets (the run name, the prompt length);
- the run: created, resumed by a restarted process, refused with nothing written when its name, model or pool is
  another's;
- the steps: committed with their metrics by the next step's begin, named by a checkpoint, rolled back by a
  restarted process to the step verl resumes from (evictions undone), recorded once after the replay;
- the draws: zero-shot at p_t = 0, step 1's attempt in step 2's intra prompt without the gold answer or a reward;
- the step's lesson cap held by two workers writing at once;
- the group draw its samples share (one draw, a cancelled sample cancels no sibling), and the run id a worker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.config import StoreConfig, read_toml
from lanpo.db import sqlfiles
from lanpo.db.connection import transaction
from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, problem_ids, upsert_problems
from lanpo.errors import ConfigError, InputError
from lanpo.feedback import lifecycle
from lanpo.feedback.summarize import Summary
from lanpo.integrations.verl import process
from lanpo.integrations.verl.store import TRAINER, ZERO_SHOT_PROMPT, Settings, VerlStore, recipe_config
from lanpo.models.tiny import tiny_tokenizer
from lanpo.rewards import Graded
from lanpo.rollout import Completion

ROOT = Path(__file__).resolve().parents[2]
DATASET = "verl-toy"
GOLD = "goldanswer"  # every gold answer holds it: a prompt that carries one is found by a substring search
PROBLEMS = 6
N = 2  # actor_rollout_ref.rollout.n
PROMPT_LENGTH = 2048  # verl's rollout.prompt_length (the tiny tokenizer is one token a character)
MODEL = "Qwen/Qwen3-4B-Base"
RECIPE = """
run_name = "from-the-recipe"
seed = 0

[data]
dataset = "verl-toy"

[feedback]
mode = "both"
p_t = 0.5
k = 2
candidates = 4

[feedback.inter]
gamma = 0.0            # every lesson of another problem is a candidate: no relevance scores needed

[summarizer]
model = "policy"
max_total_per_step = 3

[store]
per_problem_cap = 1    # a problem's second lesson evicts its first

[rollout]
max_prompt_tokens = 4096
"""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    return path


@pytest.fixture
def pids(db: Engine) -> list[int]:
    rows = [
        Question(external_id=str(i), question=f"What is {i} + {i + 1}?", answer=f"{GOLD}{i}") for i in range(PROBLEMS)
    ]
    with transaction(db) as session:
        upsert_problems(session, DATASET, rows)
        return sorted(problem_ids(session, DATASET))


def _verl(recipe: Path | None, **lanpo: Any) -> dict[str, Any]:
    """A verl config as the manager and workers get it (plain dicts where verl has a DictConfig)."""
    cfg: dict[str, Any] = {
        "trainer": {"experiment_name": "verl-exp"},
        "actor_rollout_ref": {"model": {"path": MODEL}, "rollout": {"n": N, "prompt_length": PROMPT_LENGTH}},
    }
    if recipe is not None:
        cfg["lanpo"] = {"config": str(recipe), **lanpo}
    return cfg


def _store(db: Engine, recipe: Path, *overrides: str, model: str = MODEL, run_name: str = "verl-run") -> VerlStore:
    """One process's store, as `process.process_store` makes it (over the test database)."""
    settings = Settings.of(_verl(recipe, run_name=run_name, overrides=list(overrides)))
    return VerlStore(settings, model, PROMPT_LENGTH, db=db)


def _write(
    store: VerlStore,
    step: int,
    pid: int,
    tokenizer: Any,
    rewards: list[float],
    summaries: dict[int, Summary] | None = None,
    p_t: float | None = None,
    drawn: Any = None,
) -> Any:
    """A group as a worker writes it back: drawn once, its n completions graded with verl's rewards, written."""
    drawn = drawn if drawn is not None else store.draw(step, pid, tokenizer, p_t)
    prompt_ids = tuple(tokenizer.encode(drawn.text or f"row {pid}", add_special_tokens=False))
    completions = [
        Completion(f"attempt of problem {pid} at step {step}, sample {j}: \\boxed{{{j}}}", (5,) * (3 + j), prompt_ids,
                   "stop")
        for j in range(len(rewards))
    ]  # fmt: skip
    graded = store.client.grade(drawn.prompts, [completions], rewards)
    text = drawn.text if drawn.text is not None else tokenizer.decode(list(prompt_ids))
    return store.write_group(step, drawn, text, completions, graded, summaries)


def _lesson(tag: str) -> Summary:
    return Summary(f"## Flow\nlesson {tag}\n## Principles\ncheck sums\n## Pitfalls\ncarry digits", True)


def _count(db: Engine, table: str) -> int:
    with db.connect() as conn:
        return int(conn.scalar(sa.text(f"SELECT count(*) FROM {table}")))


def _rows(db: Engine, sql: str, **params: Any) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


# --- the `lanpo:` section and the recipe ---


def test_settings_of_a_verl_config(recipe: Path) -> None:
    with pytest.raises(ConfigError) as no_recipe:
        Settings.of(_verl(None))
    assert "+lanpo.config=" in (no_recipe.value.hint or "")
    with pytest.raises(ConfigError, match=r"lanpo\.reward"):
        Settings.of(_verl(recipe, reward="grader"))
    settings = Settings.of(_verl(recipe))
    assert settings == Settings(str(recipe), "verl-exp", "lanpo", ())  # the run is verl's experiment
    named = Settings.of(_verl(recipe, run_name="mine", reward="verl", overrides=["feedback.p_t=1.0"]))
    assert (named.run_name, named.reward, named.overrides) == ("mine", "verl", ("feedback.p_t=1.0",))
    one = Settings.of(_verl(recipe, overrides="feedback.p_t=1.0"))  # `+lanpo.overrides=feedback.p_t=1.0`
    assert one.overrides == ("feedback.p_t=1.0",) and recipe_config(one, PROMPT_LENGTH).feedback.p_t == 1.0


def test_recipe_config_refuses_mel_replay_and_another_summarizer(recipe: Path) -> None:
    mel = ROOT / "train" / "configs" / "mel-demo-cpu.toml"
    with pytest.raises(ConfigError, match="MEL"):
        recipe_config(Settings(str(mel), "r"), PROMPT_LENGTH)
    with pytest.raises(ConfigError, match="MEL"):  # a recipe made MEL by an override is MEL too
        recipe_config(Settings(str(recipe), "r", overrides=("method=mel",)), PROMPT_LENGTH)
    with pytest.raises(ConfigError, match=r"enables \[replay\]"):  # stored rows verl's batch has no place for
        recipe_config(Settings(str(recipe), "r", overrides=("replay.enabled=true",)), PROMPT_LENGTH)
    other = Settings(str(recipe), "r", overrides=("summarizer.model=Qwen/Qwen2.5-7B-Instruct",))
    with pytest.raises(ConfigError, match=r"summarizer\.model"):
        recipe_config(other, PROMPT_LENGTH)
    # no lesson wanted: the summarizer's model is never used, so it is not refused
    silent = replace_overrides(other, "summarizer.enabled=false")
    assert recipe_config(silent, PROMPT_LENGTH).summarizer.model == "Qwen/Qwen2.5-7B-Instruct"
    cfg = recipe_config(Settings(str(recipe), "the-run"), 777)
    assert cfg.max_prompt_tokens == 777  # verl's prompt length, not the recipe's 4096
    assert cfg.run_name == "the-run" and cfg.summarizer.max_total_per_step == 3


def replace_overrides(settings: Settings, *more: str) -> Settings:
    return Settings(settings.config, settings.run_name, settings.reward, (*settings.overrides, *more))


# --- the run ---


def test_open_run_creates_then_resumes_the_same_run(db: Engine, recipe: Path, pids: list[int]) -> None:
    store = _store(db, recipe)
    verl = _verl(recipe)
    run = store.open_run(verl)
    [row] = _rows(db, "SELECT r.id, r.model, r.config, p.name AS pool FROM runs r JOIN pools p ON p.id = r.pool_id")
    assert (row.id, row.model, row.pool) == (run.run_id, MODEL, "verl-run")
    assert row.config["trainer"] == TRAINER and row.config["verl"] == verl
    # lanpo report reads a verl run's seed, feedback and group size where the run keeps them
    [shown] = _rows(db, sqlfiles.text_of("queries/report_runs"), run_ids=[run.run_id], experiment_ids=[])
    recipe_cfg = read_toml(recipe)
    assert (shown.feedback_mode, float(shown.p_t), int(shown.group_size), int(shown.seed)) == (
        recipe_cfg["feedback"]["mode"],
        recipe_cfg["feedback"]["p_t"],
        N,
        recipe_cfg.get("seed", 0),
    )
    assert _rows(db, "SELECT config->>'trainer' FROM runs WHERE id = :r", r=run.run_id) == [("verl",)]
    again = _store(db, recipe).open_run()  # a restarted TaskRunner
    assert again.run_id == run.run_id and again.pool.id == run.pool.id and _count(db, "runs") == 1


def test_open_run_refuses_another_kind_of_run_or_model(db: Engine, recipe: Path, pids: list[int]) -> None:
    with transaction(db) as session:
        pool = ensure_pool(session, "other-pools", StoreConfig())
        runs_repo.create_run(session, "trl-run", "train", {"trainer": "trl"}, MODEL, pool.id)
        runs_repo.create_run(session, "native-run", "train", {"lr": 1e-6}, MODEL, pool.id)
    _store(db, recipe, run_name="verl-a").open_run()
    before = (_count(db, "runs"), _count(db, "pools"))
    for name, model, needle in [
        ("trl-run", MODEL, "TRL run"),
        ("native-run", MODEL, "lanpo train run"),
        ("verl-a", "Qwen/Qwen3-8B-Base", "Qwen3-4B"),
    ]:
        with pytest.raises(InputError, match=needle):
            _store(db, recipe, model=model, run_name=name).open_run()
    assert (_count(db, "runs"), _count(db, "pools")) == before


def test_a_pool_of_another_models_lessons_is_refused_before_any_run(
    db: Engine, recipe: Path, pids: list[int], tokenizer: Any
) -> None:
    theirs = _store(db, recipe, "store.pool=shared", model="Qwen/Qwen3-8B-Base", run_name="theirs")
    theirs.open_run()
    theirs.begin_step(1)
    _write(theirs, 1, pids[0], tokenizer, [1.0, 0.0], {0: _lesson("theirs")})
    assert _count(db, "experiences") == 1
    runs = _count(db, "runs")
    with pytest.raises(InputError, match="holds lessons of Qwen/Qwen3-8B-Base"):
        _store(db, recipe, "store.pool=shared", run_name="mine").open_run()
    assert _count(db, "runs") == runs and not _rows(db, "SELECT 1 FROM runs WHERE name = 'mine'")
    mine = _store(db, recipe, "store.pool=shared", model="Qwen/Qwen3-8B-Base", run_name="mine").open_run()
    assert mine.pool.name == "shared"  # the same model's lessons are its own experience


# --- the steps ---


STEP_REWARDS = {  # step -> one group per problem, its n rewards
    1: [[1.0, 0.0], [0.5, 0.5], [1.1, 1.0]],
    2: [[0.0, 0.0], [1.0, 1.0], [0.1, 1.1]],
    3: [[0.25, 0.75], [1.0, 0.0], [0.0, 0.0]],
}


def _write_step(store: VerlStore, step: int, pids: list[int], tokenizer: Any) -> list[list[int]]:
    """Step `step` as the workers write it: one group per problem (consecutive problem ids), the first problem's
    first sample summarised (its lesson evicts the problem's lesson of an earlier step: per_problem_cap = 1)."""
    out = []
    for g, rewards in enumerate(STEP_REWARDS[step]):
        summaries = {0: _lesson(f"step {step}")} if g == 0 else None
        written = _write(store, step, pids[g], tokenizer, rewards, summaries)
        [ids] = written.attempt_ids
        assert ids == list(range(ids[0], ids[0] + N))  # one group, its attempts in order
        out.append(ids)
    return out


CONTEXTS = (
    "SELECT g.step, c.group_id, c.position, c.context_attempt_id, c.experience_version_id FROM group_contexts c "
    "JOIN rollout_groups g ON g.id = c.group_id ORDER BY c.group_id, c.position"
)


def _mean(step: int) -> float:
    flat = [r for group in STEP_REWARDS[step] for r in group]
    return sum(flat) / len(flat)


def test_steps_commit_checkpoint_and_roll_back_on_resume(
    db: Engine, recipe: Path, pids: list[int], tokenizer: Any
) -> None:
    first = _store(db, recipe)
    run = first.open_run().run_id
    for step in (1, 2, 3):
        assert first.begin_step(step) is None
        _write_step(first, step, pids, tokenizer)
        if step == 2:
            metrics = dict(_rows(db, "SELECT name, value FROM run_metrics WHERE run_id = :r AND step = 1", r=run))
            assert metrics["reward/mean"] == pytest.approx(_mean(1))
            assert metrics["count/zero_shot"] + metrics["count/intra"] + metrics["count/inter"] == 3 * N
            assert metrics["pool/added"] == 1.0
    first.checkpoint(2, "/ckpt/global_step_2")
    steps = _rows(db, "SELECT step, checkpoint FROM run_steps WHERE run_id = :r ORDER BY step", r=run)
    assert steps == [(1, None), (2, "/ckpt/global_step_2")]  # step 3 is written, not committed
    metrics = dict(_rows(db, "SELECT name, value FROM run_metrics WHERE run_id = :r AND step = 2", r=run))
    assert metrics["reward/mean"] == pytest.approx(_mean(2))
    evicted = _rows(db, "SELECT step, evicted_step FROM experiences WHERE run_id = :r ORDER BY step", r=run)
    assert evicted == [(1, 2), (2, 3), (3, None)]
    contexts = _rows(db, CONTEXTS)
    assert {c.step for c in contexts} >= {2, 3}  # later steps drew contexts: their rollback is seen
    kept_groups = _rows(db, "SELECT id FROM rollout_groups WHERE run_id = :r AND step = 1 ORDER BY id", r=run)
    kept_attempts = _rows(
        db, "SELECT a.id FROM attempts a JOIN rollout_groups g ON g.id = a.group_id WHERE g.step = 1 ORDER BY a.id"
    )

    # the process restarts; verl resumes from its checkpoint of step 1, so the first step it begins is 2
    second = _store(db, recipe)
    assert second.open_run().run_id == run
    undone = second.begin_step(2)
    assert undone is not None and undone.groups == 2 * 3 and undone.attempts == 2 * 3 * N
    assert _rows(db, "SELECT id FROM rollout_groups WHERE run_id = :r ORDER BY id", r=run) == kept_groups
    assert _rows(db, "SELECT id FROM attempts ORDER BY id") == kept_attempts
    assert _rows(db, "SELECT step, checkpoint FROM run_steps WHERE run_id = :r", r=run) == [(1, None)]
    assert _rows(db, "SELECT DISTINCT step FROM run_metrics WHERE run_id = :r", r=run) == [(1,)]
    assert _rows(db, "SELECT step, evicted_step, evicted_at FROM experiences ORDER BY step") == [(1, None, None)]
    assert _rows(db, CONTEXTS) == [c for c in contexts if c.step == 1]

    _write_step(second, 2, pids, tokenizer)  # the replayed step 2
    second.begin_step(3)
    second.finish()
    steps = _rows(db, "SELECT step, count(*) FROM run_steps WHERE run_id = :r GROUP BY step ORDER BY step", r=run)
    assert steps == [(1, 1), (2, 1)]
    groups = _rows(db, "SELECT step, problem_id, count(*) FROM rollout_groups GROUP BY step, problem_id")
    assert sorted((s, p) for s, p, _ in groups) == [(s, pids[g]) for s in (1, 2) for g in range(3)]
    assert all(count == 1 for _, _, count in groups)
    metrics = dict(_rows(db, "SELECT name, value FROM run_metrics WHERE run_id = :r AND step = 2", r=run))
    assert metrics["reward/mean"] == pytest.approx(_mean(2))
    assert _rows(db, "SELECT status FROM runs WHERE id = :r", r=run) == [("finished",)]


def test_an_async_step_records_what_it_trains_and_drops_and_commits(
    db: Engine, recipe: Path, pids: list[int], tokenizer: Any
) -> None:
    """verl's asynchronous sampler (`LanpoReplayBuffer`) names groups by verl's uid: trained ones must be in the
    store, a dropped one may not be (a failed group that wrote nothing); each call's counts are returned for verl's
    own metrics, the step's totals recorded; the step commits."""
    store = _store(db, recipe)
    run = store.open_run().run_id
    store.begin_step(1)
    for i, pid in enumerate(pids[:3]):
        drawn = store.draw(1, pid, tokenizer)
        completions = [Completion(f"\\boxed{{{j}}}", (5,), (6,), "stop") for j in range(N)]
        graded = store.client.grade(drawn.prompts, [completions], [0.0, 1.0])
        store.write_group(1, drawn, "prompt", completions, graded, None, f"uid-{i}", [(0, 0), (0, 1)])
    assert store.consume(1, ["uid-0"], {}) == {"lanpo/trained_groups": 1.0}
    store.checkpoint(1, "/ckpt/global_step_1")
    # step 2 trains step 1's groups only (one warmup batch ahead): it commits all the same, its metrics over them
    assert store.consume(2, (), {"uid-2": "filtered"}) == {"lanpo/dropped/filtered": 1.0}
    assert store.consume(2, (), {"gone": "failed"}) == {"lanpo/dropped/unwritten": 1.0}
    assert store.consume(2, ["uid-1"], {}) == {"lanpo/trained_groups": 1.0}
    assert _rows(db, "SELECT step FROM run_steps WHERE run_id = :r ORDER BY step", r=run) == [(1,)]
    store.begin_step(3)  # step 2 ends (its batch may come in parts: separate_async's parameter_sync_step)
    with pytest.raises(RuntimeError, match="trains 1 group"):
        store.consume(3, ["never-written"], {})
    metrics = dict(
        _rows(db, "SELECT name, value FROM run_metrics WHERE run_id = :r AND step = 2 AND name LIKE '%/%'", r=run)
    )
    assert {k: v for k, v in metrics.items() if k.startswith("lanpo/")} == {
        "lanpo/dropped/filtered": 1.0,
        "lanpo/dropped/unwritten": 1.0,
        "lanpo/trained_groups": 1.0,
    }
    assert metrics["reward/mean"] == 0.5 and metrics["count/zero_shot"] + metrics["count/intra"] == N
    fates = _rows(db, "SELECT trainer_uid, step, consumed_step, dropped FROM rollout_groups ORDER BY trainer_uid")
    assert fates == [("uid-0", 1, 1, None), ("uid-1", 1, 2, None), ("uid-2", 1, 2, "filtered")]
    assert _rows(db, "SELECT step FROM run_steps WHERE run_id = :r ORDER BY step", r=run) == [(1,), (2,)]
    segments = _rows(
        db,
        "SELECT f.step, l.step FROM attempts a JOIN policy_versions f ON f.id = a.first_policy_version_id "
        "JOIN policy_versions l ON l.id = a.last_policy_version_id ORDER BY a.id",
    )
    assert segments == [(0, 0), (0, 1)] * 3  # the weights after steps 0 and 1 (verl's labels)


# --- the draws ---


def test_p_t_zero_draws_zero_shot_groups(db: Engine, recipe: Path, pids: list[int], tokenizer: Any) -> None:
    store = _store(db, recipe)
    store.open_run()
    for step in (1, 2):
        store.begin_step(step)
        for pid in pids:
            drawn = store.draw(step, pid, tokenizer, p_t=0.0)
            assert (drawn.mode, drawn.text, drawn.prompts.asked) == ("zero_shot", None, ["zero_shot"])
            _write(store, step, pid, tokenizer, [1.0, 0.0], drawn=drawn)
    versions = _rows(db, "SELECT DISTINCT mode, prompt_version FROM rollout_groups")
    assert versions == [("zero_shot", ZERO_SHOT_PROMPT)] and _count(db, "group_contexts") == 0


def test_intra_draws_step_ones_attempt_without_the_answer(
    db: Engine, recipe: Path, pids: list[int], tokenizer: Any
) -> None:
    store = _store(db, recipe, "feedback.mode=intra")
    store.open_run()
    store.begin_step(1)
    pid = pids[3]
    first = store.draw(1, pid, tokenizer, p_t=1.0)
    assert first.prompts.asked == ["intra"] and first.text is None  # no history yet: zero-shot
    [attempts] = _write(store, 1, pid, tokenizer, [0.0, 1.0], drawn=first).attempt_ids
    store.begin_step(2)
    drawn = store.draw(2, pid, tokenizer, p_t=1.0)
    assert drawn.mode == "intra" and drawn.text is not None
    assert f"attempt of problem {pid} at step 1" in drawn.text
    assert GOLD not in drawn.text and "reward" not in drawn.text.lower()
    _write(store, 2, pid, tokenizer, [1.0, 1.0], drawn=drawn)
    contexts = _rows(
        db,
        "SELECT c.context_attempt_id, g.prompt FROM group_contexts c JOIN rollout_groups g ON g.id = c.group_id "
        "WHERE g.step = 2",
    )
    assert contexts and {a for a, _ in contexts} <= set(attempts)
    assert all(prompt == drawn.text for _, prompt in contexts)  # the prompt as the model saw it
    assert len(contexts) == len(drawn.prompts.items[0])


def test_the_steps_lesson_cap_holds_under_concurrent_writes(
    db: Engine, recipe: Path, pids: list[int], tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(db, recipe, "store.per_problem_cap=32")
    store.open_run()
    store.begin_step(1)
    assert store.lessons_left(1) == 3
    _write(store, 1, pids[0], tokenizer, [1.0, 1.0], {0: _lesson("first")})
    assert store.lessons_left(1) == 2
    drawn = {pid: store.draw(1, pid, tokenizer) for pid in pids[1:5]}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    # the race made certain: each worker's first write waits, once it has counted the step's lessons, for the other
    # to count too (unless the other cannot count meanwhile: the step's lock), then admits what it counted room for
    counted = threading.Barrier(2)
    within = lifecycle.hold_step_cap  # the store API's, which every writer of a step goes through

    def racing(session: Any, run_id: int, step: int, records: Any, total: int) -> None:
        within(session, run_id, step, records, total)
        with contextlib.suppress(threading.BrokenBarrierError):
            counted.wait(timeout=0.5)

    monkeypatch.setattr(lifecycle, "hold_step_cap", racing)

    def worker(mine: list[int]) -> None:
        try:
            barrier.wait(timeout=30)
            for pid in mine:  # every sample of every group summarised: far more than the step may add
                _write(store, 1, pid, tokenizer, [1.0, 1.0], {0: _lesson(f"{pid}a"), 1: _lesson(f"{pid}b")},
                       drawn=drawn[pid])  # fmt: skip
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(pids[1 + 2 * w : 3 + 2 * w],)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert _count(db, "rollout_groups") == 5 and _count(db, "attempts") == 5 * N
    assert _rows(db, "SELECT count(*) FROM experiences WHERE step = 1") == [(3,)]  # max_total_per_step
    assert store.lessons_left(1) == 0
    _write(store, 1, pids[5], tokenizer, [1.0, 1.0], {0: _lesson("late")})
    assert _count(db, "experiences") == 3
    store.begin_step(2)
    assert store.lessons_left(2) == 3  # a new step's cap


# --- one process's draws and run ---


class Drawn:
    """What a draw returns (a GroupPrompt in the worker)."""


def test_group_draws_share_one_draw() -> None:
    calls: list[str] = []

    async def main() -> None:
        draws = process.GroupDraws()
        result = Drawn()

        async def draw() -> Any:
            calls.append("draw")
            await asyncio.sleep(0.01)
            return result

        got = await asyncio.gather(*[draws.get(3, "uid-a", draw) for _ in range(4)])
        assert len(calls) == 1 and all(g is result for g in got)
        assert draws.forget(3, "uid-a") is result and draws.forget(3, "uid-a") is None
        other = await draws.get(4, "uid-a", draw)  # another step's group draws again
        assert other is result and len(calls) == 2

        async def fails() -> Any:
            calls.append("fails")
            await asyncio.sleep(0.01)
            raise RuntimeError("the store is gone")

        failed = await asyncio.gather(*[draws.get(5, "uid-b", fails) for _ in range(3)], return_exceptions=True)
        assert calls.count("fails") == 1 and all(isinstance(f, RuntimeError) for f in failed)
        assert draws.forget(5, "uid-b") is None  # a failure is no result
        assert await draws.get(5, "uid-b", draw) is result  # and it is not kept: the group draws again

    asyncio.run(main())


def test_a_cancelled_sample_cancels_no_sibling() -> None:
    """verl cancels a sample's task (an aborted request): its siblings still get the group's one draw."""

    async def main() -> None:
        draws = process.GroupDraws()
        result = Drawn()
        calls = 0

        async def draw() -> Any:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.05)
            return result

        samples = [asyncio.ensure_future(draws.get(1, "uid", draw)) for _ in range(3)]
        await asyncio.sleep(0.01)
        samples[0].cancel()
        got = await asyncio.gather(*samples, return_exceptions=True)
        assert isinstance(got[0], asyncio.CancelledError) and got[1] is result and got[2] is result
        assert calls == 1 and draws.forget(1, "uid") is result

    asyncio.run(main())


def test_run_id_of_needs_lanpos_manager(recipe: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        process.run_id_of(_verl(recipe))
    assert "agent_loop_manager_class" in (missing.value.hint or "")
    assert process.run_id_of(_verl(recipe, run_id=7)) == 7
    assert process.verl_shape(_verl(recipe)) == (MODEL, N, PROMPT_LENGTH)


def test_grade_is_lanpos_reward(db: Engine, recipe: Path, pids: list[int], tokenizer: Any) -> None:
    """lanpo.reward = lanpo: a sample's reward is lanpo's grade of its response against the gold answer."""
    store = _store(db, recipe)
    store.open_run()
    store.begin_step(1)
    drawn = store.draw(1, pids[2], tokenizer, p_t=0.0)
    graded = store.grade(drawn, [f"\\boxed{{{GOLD}2}}", "\\boxed{5}"])
    assert [g.correct for g in graded] == [True, False] and graded[0].reward >= 1.0 > graded[1].reward
    assert isinstance(graded[0], Graded)
