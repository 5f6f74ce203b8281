"""The whole loop on a tiny random model against the real store: rows, contexts, metrics, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.errors import ConfigError
from lanpo.train.config import FeedbackConfig
from lanpo.train.loop import train
from lanpo.train.plumbing import checkpoint as ckpt
from tests.train.conftest import tiny_config


def _scalar(db: Engine, sql: str, **params: object) -> object:
    with db.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def test_train_records_every_step_in_the_store(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    seen: list[int] = []
    result = train(tiny_config(tmp_path), db=db, progress=False, on_step=lambda s, m: seen.append(s))
    assert result.steps == [1, 2, 3] and seen == [1, 2, 3]
    run = result.run_id
    assert _scalar(db, "SELECT array_agg(step ORDER BY step) FROM run_steps WHERE run_id = :r", r=run) == [0, 1, 2, 3]
    assert _scalar(db, "SELECT count(*) FROM run_attempts WHERE run_id = :r", r=run) == 3 * 3 * 2
    # one group (one stored prompt) per problem and step, holding its n = 2 rollouts
    assert _scalar(db, "SELECT count(*) FROM rollout_groups WHERE run_id = :r", r=run) == 3 * 3
    assert (
        _scalar(db, "SELECT pl.name FROM runs r JOIN pools pl ON pl.id = r.pool_id WHERE r.id = :r", r=run) == "tiny"
    )
    assert (
        _scalar(db, "SELECT count(*) FROM experiences e JOIN pools pl ON pl.id = e.pool_id WHERE pl.name <> 'tiny'")
        == 0
    )
    assert _scalar(db, "SELECT status FROM runs WHERE id = :r", r=run) == "finished"
    # attempts of step s were produced by the policy of step s - 1
    assert _scalar(
        db,
        "SELECT bool_and(pv.step = g.step - 1) FROM rollout_groups g "
        "JOIN policy_versions pv ON pv.id = g.policy_version_id",
    )
    # ... and each carries the hash of the adapter that sampled it: that policy version's
    assert _scalar(
        db,
        "SELECT bool_and(a.served_adapter_sha256 = pv.adapter_sha256) FROM attempts a "
        "JOIN rollout_groups g ON g.id = a.group_id JOIN policy_versions pv ON pv.id = g.policy_version_id "
        "WHERE g.run_id = :r",
        r=run,
    )
    # intra contexts come from the same problem; inter contexts from other problems' experiences
    assert (
        _scalar(
            db,
            "SELECT count(*) FROM group_contexts c JOIN rollout_groups g ON g.id = c.group_id "
            "JOIN run_attempts src ON src.attempt_id = c.context_attempt_id WHERE src.problem_id <> g.problem_id",
        )
        == 0
    )
    assert (
        _scalar(
            db,
            "SELECT count(*) FROM group_contexts c JOIN rollout_groups g ON g.id = c.group_id "
            "JOIN experience_versions v ON v.id = c.experience_version_id "
            "JOIN experiences e ON e.id = v.experience_id "
            "WHERE e.problem_id = g.problem_id",
        )
        == 0
    )
    intra_used = _scalar(db, "SELECT count(*) FROM group_contexts WHERE context_attempt_id IS NOT NULL")
    inter_used = _scalar(db, "SELECT count(*) FROM group_contexts WHERE experience_version_id IS NOT NULL")
    assert intra_used and inter_used, "p_t = 1 and a filled store: later steps must carry both kinds of context"
    assert _scalar(db, "SELECT count(DISTINCT mode) FROM rollout_groups WHERE step > 1") >= 2
    assert _scalar(db, "SELECT count(*) FROM experiences WHERE run_id = :r", r=run) > 0
    names = set(_scalar(db, "SELECT array_agg(DISTINCT name) FROM run_metrics WHERE run_id = :r", r=run))  # type: ignore[arg-type]
    for name in (
        "reward/mean",
        "accuracy/mean",
        "kl",
        "entropy",
        "grad_norm",
        "clip_frac",
        "pool/active",
        "time/generate",
        "time/update",
        "response_len/mean",
    ):
        assert name in names, name
    # the newest checkpoint's adapter is the one the database names for the last step
    sha = _scalar(db, "SELECT adapter_sha256 FROM policy_versions WHERE run_id = :r AND step = 3", r=run)
    import torch

    state = torch.load(ckpt.step_dir(result.checkpoint_dir, 3) / ckpt.STATE_FILE, weights_only=False)
    assert state["adapter_sha256"] == sha
    assert len(list(result.checkpoint_dir.glob("step-*"))) == 2  # keep_checkpoints


def test_existing_run_needs_resume_and_resume_of_a_finished_run_does_nothing(
    db: Engine, toy_problems: list[int], tmp_path: Path
) -> None:
    cfg = tiny_config(tmp_path, steps=1, feedback=FeedbackConfig(mode="none"))
    train(cfg, db=db, progress=False)
    with pytest.raises(ConfigError, match="already exists"):
        train(cfg, db=db, progress=False)
    again = train(cfg, db=db, resume=True, progress=False)
    assert again.steps == []
    longer = tiny_config(tmp_path, steps=2, feedback=FeedbackConfig(mode="none"))
    assert train(longer, db=db, resume=True, progress=False).steps == [2]


def test_dataset_is_generated_on_first_use_and_batches_are_reproducible(db: Engine) -> None:
    from lanpo.db.connection import transaction
    from lanpo.errors import InputError
    from lanpo.feedback import schedule
    from lanpo.feedback import store as run
    from lanpo.feedback.config import DataConfig

    data = DataConfig(dataset="gen_once", task="chain_sum", n=5, task_options={"min_terms": 2, "max_terms": 2})
    with transaction(db) as session:
        ids = run.ensure_dataset(session, data)
        assert len(ids) == 5 and run.ensure_dataset(session, data) == ids
        with pytest.raises(InputError, match="has no problems"):
            run.ensure_dataset(session, DataConfig(dataset="nothing_here"))
    first = [schedule.batch_problem_ids(ids, 3, seed=7, step=s) for s in (1, 2, 3)]
    assert first == [schedule.batch_problem_ids(ids, 3, seed=7, step=s) for s in (1, 2, 3)]
    assert sorted(first[0] + first[1][:2]) == sorted(ids)  # one epoch visits every problem once
    modes = schedule.choose_modes(list(range(400)), "both", 0.5, seed=1, step=1)
    assert 0.4 < modes.count("zero_shot") / 400 < 0.6 and {"intra", "inter"} <= set(modes)
    assert set(schedule.choose_modes(list(range(50)), "none", 1.0, seed=1, step=1)) == {"zero_shot"}


def test_feedback_prompts_get_their_own_completion_budget(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    from lanpo.train.config import RolloutConfig

    cfg = tiny_config(tmp_path, rollout=RolloutConfig(n=2, max_new_tokens=6, feedback_max_new_tokens=20))
    run = train(cfg, db=db, progress=False).run_id
    with db.connect() as conn:
        sql = "SELECT mode, max(completion_tokens) FROM run_attempts WHERE run_id = :r GROUP BY mode"
        longest = dict(conn.execute(sa.text(sql), {"r": run}).all())
    # the tiny random model rarely stops by itself, so each mode's longest completion is its budget
    assert longest.pop("zero_shot") == 6
    assert longest and set(longest.values()) == {20}, longest  # intra / inter, served from step 2 on


def test_the_budget_of_each_mode() -> None:
    from lanpo.train.config import RolloutConfig

    assert RolloutConfig(max_new_tokens=64).budget("inter") == 64
    assert RolloutConfig(max_new_tokens=64, feedback_max_new_tokens=160).budget("intra") == 160
    assert RolloutConfig(max_new_tokens=64, feedback_max_new_tokens=160).budget("zero_shot") == 64
    with pytest.raises(ConfigError, match="feedback_max_new_tokens"):
        RolloutConfig(feedback_max_new_tokens=-1)
