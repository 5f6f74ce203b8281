"""Validation during training (held out, recorded, never feeding the pool), and the feedback the step reports:
how many prompts asked for intra / inter context, how many got it, and why the others did not."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanpo.db.connection import transaction
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.errors import ConfigError
from lanpo.feedback.config import DataConfig, FeedbackConfig, InterConfig
from lanpo.feedback.contexts import MISSED
from lanpo.train.config import TrainConfig, ValidationConfig
from lanpo.train.loop import train
from lanpo.train.validate import prepare_validation, validation_metrics
from tests.train.conftest import tiny_config


def _rows(db: Engine, sql: str) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def _held_out(db: Engine, n: int = 3) -> None:
    with transaction(db) as session:
        upsert_problems(session, "toy-val", [Question(f"v{i}", f"What is {i} * 7?", str(7 * i)) for i in range(n)])


def test_validation_is_recorded_and_never_feeds_training(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    _held_out(db)
    cfg = tiny_config(tmp_path, steps=3, eval=ValidationConfig(every=2, n=3, k=2, max_new_tokens=8))
    result = train(cfg, db=db, progress=False)
    assert sorted(result.validation) == [0, 2, 3]  # the start, every 2 steps, the last step
    for metrics in result.validation.values():
        assert set(metrics) == {
            "val/toy-val/mean@2", "val/toy-val/pass@2", "val/toy-val/boxed", "val/toy-val/samples", "time/validate",
            "cost/validation/generated_tokens", "cost/validation/prompt_tokens",
        }  # fmt: skip
        assert metrics["val/toy-val/samples"] == 3 * 2
        assert metrics["time/validate"] > 0
    assert result.metrics[1]["val/toy-val/mean@2"] == result.validation[2]["val/toy-val/mean@2"]
    # stored: mode val, one group of k per problem and validated step, the policy of that step
    assert _rows(db, "SELECT step, count(*) FROM run_attempts WHERE mode = 'val' GROUP BY step ORDER BY step") == [
        (0, 6), (2, 6), (3, 6)
    ]  # fmt: skip
    assert _rows(
        db,
        "SELECT bool_and(pv.step = g.step) FROM rollout_groups g "
        "JOIN policy_versions pv ON pv.id = g.policy_version_id WHERE g.mode = 'val'",
    ) == [(True,)]
    names = {r[0] for r in _rows(db, "SELECT DISTINCT name FROM run_metrics WHERE step = 0")}
    assert {"val/toy-val/mean@2", "time/validate"} <= names
    assert _rows(db, "SELECT step FROM run_metrics WHERE name = 'time/validate' ORDER BY step") == [(0,), (2,), (3,)]
    # held out: validation problems are never trained on, never become experiences, never reach a context
    assert _rows(db, "SELECT DISTINCT dataset FROM run_attempts WHERE mode <> 'val'") == [("toy",)]
    assert _rows(db, "SELECT count(*) FROM experiences e JOIN problems p ON p.id = e.problem_id "
                     "WHERE p.dataset = 'toy-val'") == [(0,)]  # fmt: skip
    assert _rows(db, "SELECT count(*) FROM group_contexts c JOIN run_attempts a "
                     "ON a.attempt_id = c.context_attempt_id WHERE a.mode = 'val'") == [(0,)]  # fmt: skip
    assert _rows(db, "SELECT count(*) FROM relevance_scores r JOIN problems p ON p.id IN (r.problem_id, "
                     "r.candidate_problem_id) WHERE p.dataset = 'toy-val'") == [(0,)]  # fmt: skip


def test_resume_does_not_validate_twice(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    _held_out(db)
    cfg = tiny_config(tmp_path, steps=2, eval=ValidationConfig(every=2, n=3, k=2, max_new_tokens=8))
    train(cfg, db=db, progress=False)
    cfg.steps = 4
    again = train(cfg, db=db, resume=True, progress=False)
    assert sorted(again.validation) == [4]
    counts = _rows(db, "SELECT step, count(*) FROM run_attempts WHERE mode = 'val' GROUP BY step ORDER BY step")
    assert counts == [(0, 6), (2, 6), (4, 6)]


def test_generated_validation_leaves_out_training_questions(db: Engine) -> None:
    options = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # only 100 questions exist
    cfg = TrainConfig(
        data=DataConfig(dataset="sums", task="chain_sum", n=60, task_options=options),
        eval=ValidationConfig(every=1, n=20),
    )
    from lanpo.feedback.store import ensure_dataset

    with transaction(db) as session:
        ensure_dataset(session, cfg.data)
        held_out = prepare_validation(session, cfg)
    assert held_out is not None and held_out.dataset == "sums-val" and len(held_out.problem_ids) == 20
    training = {r[0] for r in _rows(db, "SELECT question FROM problems WHERE dataset = 'sums'")}
    assert not training & set(held_out.questions)
    with transaction(db) as session:
        upsert_problems(session, "leaky", [Question("x", sorted(training)[0], "1")])
    leaky = TrainConfig(data=cfg.data, eval=ValidationConfig(every=1, dataset="leaky"))
    with pytest.raises(ConfigError, match="shares 1 question"), transaction(db) as session:
        prepare_validation(session, leaky)
    with pytest.raises(ConfigError, match="validation must be held out"):
        TrainConfig(data=cfg.data, eval=ValidationConfig(every=1, dataset="sums"))
    # the generated set, asked later for more problems than it was generated with: refused, not silently fewer
    larger = TrainConfig(data=cfg.data, eval=ValidationConfig(every=1, n=30))
    refused = r"'sums-val' holds 20 problems, generated for a smaller eval\.n"
    with pytest.raises(ConfigError, match=refused), transaction(db) as session:
        prepare_validation(session, larger)
    # an imported set is read as "the first n": a set smaller than eval.n is used whole
    short = TrainConfig(data=cfg.data, eval=ValidationConfig(every=1, n=30, dataset="imported"))
    with transaction(db) as session:
        upsert_problems(session, "imported", [Question("y", "What is 123456 + 1?", "123457")])
        assert len(prepare_validation(session, short).problem_ids) == 1  # type: ignore[union-attr]


def test_validation_metrics_by_hand() -> None:
    from lanpo.feedback.record import GroupRecord, RolloutRecord

    def group(correct: list[bool], boxed: list[bool]) -> GroupRecord:
        rollouts = [RolloutRecord("r", float(c), c, b, 3, False) for c, b in zip(correct, boxed, strict=True)]
        return GroupRecord(1, "val", "p", 2, [], rollouts)

    metrics = validation_metrics(
        [group([True, False], [True, True]), group([False, False], [False, True]), group([True, True], [True, True])],
        "d",
        2,
    )
    assert metrics == {
        "val/d/mean@2": pytest.approx(0.5),
        "val/d/pass@2": pytest.approx(2 / 3),
        "val/d/boxed": 5 / 6,
        "val/d/samples": 6.0,  # 3 problems x k = 2: the n of the matched-budget table's binomial SE
    }


def test_feedback_asked_served_and_missed(db: Engine, toy_problems: list[int], tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, steps=2)  # p_t = 1: every prompt asks for intra or inter
    result = train(cfg, db=db, progress=False)
    n = cfg.rollout.n
    for step, m in enumerate(result.metrics, start=1):
        asked = m["feedback/asked/intra"] + m["feedback/asked/inter"]
        served = m["feedback/served/intra"] + m["feedback/served/inter"]
        missed = sum(m[f"feedback/missed/{reason}"] for reason in MISSED)
        assert asked == cfg.batch_size * n and served + missed == asked, step
        assert m["count/intra"] == m["feedback/served/intra"] and m["count/inter"] == m["feedback/served/inter"]
    first = result.metrics[0]  # an empty store: intra finds no history, inter an empty pool
    assert first["feedback/served/intra"] == first["feedback/served/inter"] == 0
    assert first["feedback/missed/no_history"] == first["feedback/asked/intra"]
    assert first["feedback/missed/empty_pool"] == first["feedback/asked/inter"]


def test_inter_without_relevance_fails_at_start_unless_allowed(db: Engine, tmp_path: Path) -> None:
    with transaction(db) as session:
        upsert_problems(session, "toy", [Question(str(i), f"What is {i} + 1?", str(i + 1)) for i in range(4)])
    cfg = tiny_config(tmp_path, steps=1, feedback=FeedbackConfig(mode="both", p_t=1.0, k=2, candidates=4))
    with pytest.raises(ConfigError, match="relevance_scores holds no score yet") as err:
        train(cfg, db=db, progress=False)
    assert "lanpo relevance build --dataset toy" in (err.value.hint or "")
    assert _rows(db, "SELECT count(*) FROM runs") == [(0,)]  # refused before anything was written
    feedback = FeedbackConfig(mode="both", p_t=1.0, k=2, candidates=4, inter=InterConfig(allow_empty=True))
    allowed = tiny_config(tmp_path, steps=1, feedback=feedback)
    metrics = train(allowed, db=db, progress=False).metrics[0]
    assert metrics["feedback/served/inter"] == 0
