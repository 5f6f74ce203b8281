"""`run_eval`: the table equals a SQL recount of the stored attempts and the scripted truth; storage shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.orm import Session

from lanpo.config import from_mapping, load_toml
from lanpo.errors import ConfigError, InputError
from lanpo.inference.answerer import Answerer
from lanpo.inference.config import EvalConfig, RetrievalSettings
from lanpo.inference.evaluate import run_eval
from lanpo.inference.table import recount

from .conftest import ScriptedBackend, question_text, scripted_expectation

REPO = Path(__file__).resolve().parents[2]


def eval_file(tmp_path: Path, qs: range) -> Path:
    path = tmp_path / "gsm.jsonl"
    lines = [
        json.dumps({"id": f"g{q}", "question": f"{question_text(q, 3, q)} Use addition.", "answer": str(q + 3)})
        for q in qs
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def config(tmp_path: Path, **kw: Any) -> EvalConfig:
    data = {
        "run_name": "eval-test",
        "out_dir": str(tmp_path / "out"),
        "k_samples": 3,
        "batch_size": 2,
        "datasets": [{"name": "gsm", "file": "gsm.jsonl"}, {"name": "train", "limit": 3}],
        "modes": ["zero_shot", "retrieval", "self_correct"],
        "retrieval": {"stage1": "bm25", "top_k": 4, "gamma": 0.0, "m": 2, "judge": "none"},
    }
    data.update(kw)
    return from_mapping(EvalConfig, data)


def test_table_equals_recount_and_truth(
    tmp_path: Path, db: SAEngine, make_answerer: Callable[..., Answerer], pool: dict[str, Any], session: Session
) -> None:
    eval_file(tmp_path, range(5))
    answerer = make_answerer(retrieval=RetrievalSettings(stage1="bm25", top_k=4, gamma=0.0, m=2, judge="none"))
    answerer.backend = ScriptedBackend(answerer.tokenizer)
    printed: list[str] = []
    result = run_eval(
        config(tmp_path), db, config_dir=tmp_path, answerer=answerer, echo=printed.append, show_progress=False
    )

    # truth from the script: the same numbers whichever way they are counted
    train_qs = [100, 101, 102]  # the pool fixture's first three problems are q100..q102
    truth = {
        ("zero_shot", "gsm"): sum(scripted_expectation(q, 3) for q in range(5)) / 5,
        ("zero_shot", "train"): sum(scripted_expectation(q, 3) for q in train_qs) / 3,
        ("self_correct", "gsm"): sum(q % 3 == 0 for q in range(5)) / 5,  # the revision is sample 0 of its prompt
        ("self_correct", "train"): sum(q % 3 == 0 for q in train_qs) / 3,
    }
    truth[("retrieval", "gsm")], truth[("retrieval", "train")] = (
        truth[("zero_shot", "gsm")],
        truth[("zero_shot", "train")],
    )
    assert set(result.table.cells) == set(truth) == set(result.computed.cells)
    for key, value in truth.items():
        assert result.table.cells[key].mean == pytest.approx(value), key
        assert result.computed.cells[key] == result.table.cells[key]
    assert 0 < result.table.average("zero_shot") < 1
    again = recount(session, result.run_id, ["zero_shot", "retrieval", "self_correct"], ["gsm", "train"], 3)
    assert again.cells == result.table.cells

    # storage: one eval run, every turn an attempt with its mode
    run = session.execute(sa.text("SELECT kind, status FROM runs WHERE id = :r"), {"r": result.run_id}).one()
    assert (run.kind, run.status) == ("eval", "finished")
    counts = dict(
        session.execute(
            sa.text("SELECT mode, count(*) FROM run_attempts WHERE run_id = :r GROUP BY mode"), {"r": result.run_id}
        ).all()
    )
    assert counts == {"zero_shot": 8 * 3, "retrieval": 8 * 3, "self_correct": 2 * 8 * 3}
    # self-correct revisions point at their first attempt of the same problem
    links = session.execute(
        sa.text(
            "SELECT a.step, b.step AS prev_step, a.problem_id = b.problem_id AS same FROM group_contexts c "
            "JOIN run_attempts a ON a.group_id = c.group_id "
            "JOIN run_attempts b ON b.attempt_id = c.context_attempt_id WHERE a.run_id = :r"
        ),
        {"r": result.run_id},
    ).all()
    assert len(links) == 8 * 3 and all(row == (1, 0, True) for row in links)
    # retrieval attempts list the experiences in their prompts, never their own problem's
    used = session.execute(
        sa.text(
            "SELECT a.problem_id, e.problem_id AS source FROM group_contexts c "
            "JOIN run_attempts a ON a.group_id = c.group_id "
            "JOIN experience_versions v ON v.id = c.experience_version_id "
            "JOIN experiences e ON e.id = v.experience_id "
            "WHERE a.run_id = :r AND a.mode = 'retrieval'"
        ),
        {"r": result.run_id},
    ).all()
    assert used and all(row.problem_id != row.source for row in used)
    # the store's views cover evaluation: reward curves per mode (step = turn) and experience usage
    rewards = {
        (row.mode, row.step): row
        for row in session.execute(sa.text("SELECT * FROM run_rewards WHERE run_id = :r"), {"r": result.run_id})
    }
    assert rewards[("zero_shot", 0)].attempts == rewards[("self_correct", 1)].attempts == 8 * 3
    gsm_sc, train_sc = truth[("self_correct", "gsm")], truth[("self_correct", "train")]
    assert float(rewards[("self_correct", 1)].accuracy) == pytest.approx((5 * gsm_sc + 3 * train_sc) / 8)
    assert session.scalar(sa.text("SELECT sum(times_injected) FROM experience_usage")) == len(used)
    metrics = dict(
        session.execute(sa.text("SELECT name, value FROM run_metrics WHERE run_id = :r"), {"r": result.run_id}).all()
    )
    assert metrics["mean@k/zero_shot/gsm"] == pytest.approx(truth[("zero_shot", "gsm")])
    assert metrics["first_turn/gsm"] == pytest.approx(truth[("zero_shot", "gsm")])  # turn 1 is a zero-shot answer
    assert "retrieval_fallbacks/train" in metrics and metrics["problems_per_second"] > 0

    # outputs: printed and written
    assert result.markdown_path.read_text() == result.table.to_markdown() == printed[0]
    assert result.csv_path.read_text() == result.table.to_csv()
    assert "problems/s" in printed[-1]


def test_eval_on_the_tiny_model_stores_what_it_prints(
    tmp_path: Path, db: SAEngine, make_answerer: Callable[..., Answerer], session: Session
) -> None:
    eval_file(tmp_path, range(3))
    cfg = config(
        tmp_path, datasets=[{"name": "gsm", "file": "gsm.jsonl"}], modes=["zero_shot", "self_correct"], k_samples=2
    )
    result = run_eval(cfg, db, config_dir=tmp_path, answerer=make_answerer(), echo=lambda _: None, show_progress=False)
    assert result.table.cells == result.computed.cells
    assert result.table.cells[("self_correct", "gsm")].samples == 6
    total = session.scalar(sa.text("SELECT count(*) FROM run_attempts WHERE run_id = :r"), {"r": result.run_id})
    assert total == 3 * 2 + 2 * 3 * 2


def test_failed_eval_marks_the_run_failed(tmp_path: Path, db: SAEngine, tiny: Any, session: Session) -> None:
    from lanpo.config import StoreConfig
    from lanpo.db.repo.pools import ensure_pool

    ensure_pool(session, "p", StoreConfig())
    session.commit()
    eval_file(tmp_path, range(2))
    model, tokenizer = tiny
    answerer = Answerer(model, tokenizer=tokenizer, db=None)  # retrieval without a database fails mid-run
    cfg = config(tmp_path, datasets=[{"name": "gsm", "file": "gsm.jsonl"}], modes=["retrieval"])
    with pytest.raises(ConfigError, match="needs a database"):
        run_eval(cfg, db, config_dir=tmp_path, answerer=answerer, echo=lambda _: None, show_progress=False)
    assert session.scalar(sa.text("SELECT status FROM runs WHERE name = 'eval-test'")) == "failed"


def test_dataset_without_gold_or_unknown_is_refused(tmp_path: Path, db: SAEngine, tiny: Any) -> None:
    (tmp_path / "gsm.jsonl").write_text('{"id": "1", "question": "What is 1+1?"}\n')
    model, tokenizer = tiny
    answerer = Answerer(model, tokenizer=tokenizer)
    cfg = config(tmp_path, datasets=[{"name": "gsm", "file": "gsm.jsonl"}])
    with pytest.raises(InputError, match="have no gold answer"):
        run_eval(cfg, db, config_dir=tmp_path, answerer=answerer, echo=lambda _: None, show_progress=False)
    with pytest.raises(InputError, match="unknown dataset 'nowhere'"):
        run_eval(config(tmp_path, datasets=[{"name": "nowhere"}]), db, answerer=answerer, echo=lambda _: None)


def test_config_validation_and_shipped_configs() -> None:
    with pytest.raises(ConfigError, match="unknown config key colour"):
        from_mapping(EvalConfig, {"colour": 1, "datasets": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="datasets is empty"):
        EvalConfig()
    with pytest.raises(ConfigError, match="unknown inference mode"):
        from_mapping(EvalConfig, {"modes": ["best_of_n"], "datasets": [{"name": "a"}]})
    with pytest.raises(ConfigError, match=r"retrieval\.gamma"):
        from_mapping(EvalConfig, {"retrieval": {"gamma": 1.5}, "datasets": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="threads must be >= 0"):
        from_mapping(EvalConfig, {"threads": -1, "datasets": [{"name": "a"}]})
    shipped = sorted((REPO / "train" / "configs").glob("eval-*.toml"))
    assert len(shipped) >= 2
    for path in shipped:
        cfg = load_toml(EvalConfig, path)
        assert cfg.datasets and cfg.modes


def test_methods_give_table2s_shape(tmp_path: Path, db: SAEngine, pool: dict[str, Any], session: Session) -> None:
    """[[methods]]: one eval run per trained method, rows = method x mode; both self-correction variants have
    their own row although the store keeps one attempt mode for them."""
    from lanpo.inference.evaluate import run_methods

    eval_file(tmp_path, range(2))
    cfg = config(
        tmp_path,
        model="tiny-random",
        k_samples=2,
        datasets=[{"name": "gsm", "file": "gsm.jsonl"}],
        modes=["zero_shot", "retrieval", "self_correct", "self_correct_single"],
        sampling={"max_new_tokens": 4, "seed": 0},
        methods=[{"name": "grpo", "pool": "trained"}, {"name": "lanpo"}],
    )
    printed: list[str] = []
    result = run_methods(cfg, db, config_dir=tmp_path, echo=printed.append, show_progress=False)
    assert list(result.results) == ["grpo", "lanpo"]
    rows = [f"{m}/{mode}" for m in ("grpo", "lanpo") for mode in cfg.modes]
    assert result.table.modes == rows and result.table.datasets == ["gsm"]
    for method, sub in result.results.items():
        assert sub.run_name == f"eval-test-{method}"
        assert set(sub.table.cells) == {(mode, "gsm") for mode in cfg.modes}
        for mode in cfg.modes:
            assert result.table.cells[(f"{method}/{mode}", "gsm")] == sub.table.cells[(mode, "gsm")]
            assert sub.table.cells[(mode, "gsm")] == sub.computed.cells[(mode, "gsm")]  # recount == memory
    text = result.markdown_path.read_text()
    assert "grpo × Retrieval" in text and "lanpo × Self-correct (single turn)" in text
    assert (tmp_path / "out" / "grpo" / "table.md").is_file()
    with pytest.raises(InputError, match="already exists"):
        run_methods(cfg, db, config_dir=tmp_path, echo=printed.append, show_progress=False)


def test_threads_pin_the_evaluation(tiny_dir: Path, db: SAEngine) -> None:
    import torch

    from lanpo.inference.evaluate import build_answerer

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that the check cannot pass by the environment's OMP_NUM_THREADS=1 alone
    try:
        build_answerer(
            from_mapping(EvalConfig, {"model": str(tiny_dir), "threads": 1, "datasets": [{"name": "a"}]}), db
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


BAD_EVAL_CONFIGS = [
    {"retrieval": {"pool": " "}},
    {"retrieval": {"stage1": "grep"}},
    {"retrieval": {"top_k": 0}},
    {"retrieval": {"gamma": -0.1}},
    {"retrieval": {"m": 0}},
    {"retrieval": {"m": 20, "top_k": 16}},
    {"retrieval": {"scorer": " "}},
    {"sampling": {"max_new_tokens": 0}},
    {"sampling": {"temperature": -1.0}},
    {"sampling": {"top_p": 0.0}},
    {"datasets": [{"name": " "}]},
    {"datasets": [{"name": "a:b"}]},
    {"datasets": [{"name": "a", "limit": 0}]},
    {"methods": [{"name": "a/b"}]},
    {"methods": [{"name": "a", "pool": " "}]},
    {"methods": [{"name": "a"}, {"name": "a"}]},
    {"modes": []},
    {"modes": ["zero_shot", "zero-shot"]},
    {"datasets": [{"name": "a"}, {"name": "a"}]},
    {"k_samples": 0},
    {"batch_size": 0},
    {"threads": -1},
    {"backend": "tgi"},
    {"dtype": "int4"},
]


@pytest.mark.parametrize("bad", BAD_EVAL_CONFIGS, ids=[json.dumps(b, sort_keys=True) for b in BAD_EVAL_CONFIGS])
def test_every_eval_config_error_says_how_to_fix_it(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(EvalConfig, {"datasets": [{"name": "a"}], **bad})
    assert caught.value.hint, caught.value.message
