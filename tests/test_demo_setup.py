"""What `lanpo demo` sets up before any model loads: its run's name, its one held-out set, its continue command."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy.engine import Engine

from lanpo.data.generate import generate_problems
from lanpo.db.connection import transaction
from lanpo.db.repo.runs import create_run
from lanpo.demo import (
    DEFAULT_RUN,
    DemoOptions,
    _demo_config,
    _run_name,
    demo_overrides,
    held_out_problems,
    recipe_path,
)
from lanpo.errors import InputError
from lanpo.train.config import load_config

OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # demo-cpu.toml's chain sums


def options(**changes: object) -> DemoOptions:
    return DemoOptions(config=recipe_path("demo-cpu.toml"), **changes)  # type: ignore[arg-type]


def test_the_run_is_demo_then_demo_2(db: Engine) -> None:
    assert DEFAULT_RUN == "demo" and _run_name(db, None) == "demo"
    with transaction(db) as session:
        create_run(session, "demo", "train", {})
    assert _run_name(db, None) == "demo-2" and _run_name(db, "mine") == "mine"
    with pytest.raises(InputError, match="a run named 'demo' already exists") as raised:
        _run_name(db, "demo")  # before any model loads, not after the warm start
    assert "--run-name" in (raised.value.hint or "")
    assert _demo_config(options()).run_name == "demo"  # stage 1 replaces it with the free name
    assert _demo_config(options(run_name="mine")).run_name == "mine"


def test_training_validates_on_the_held_out_set_stage_6_answers() -> None:
    cfg = _demo_config(options(n_test=5))
    assert (cfg.eval.dataset, cfg.eval.n) == (f"{cfg.data.dataset}-test", 5)
    same = _demo_config(options(n_test=2, overrides=("eval.n=2", "eval.k=2")))  # the same set: allowed
    assert (same.eval.n, same.eval.k) == (2, 2)
    with pytest.raises(InputError, match="one held-out set") as raised:
        _demo_config(options(n_test=4, overrides=("eval.n=24",)))
    assert "--n-test" in (raised.value.hint or "")
    with pytest.raises(InputError, match="one held-out set"):
        _demo_config(options(overrides=('eval.dataset="other"',)))


def test_the_held_out_set_holds_no_training_problem() -> None:
    """The first test-split problems, skipping any the training set holds; too small a task space is an error."""
    first = [r["question"] for r in generate_problems("chain_sum", 8, 0, "test", OPTIONS)]
    training = {first[1], first[4]}
    held = [r["question"] for r in held_out_problems("chain_sum", 8, 0, OPTIONS, training)]
    assert len(held) == len(set(held)) == 8 and not training & set(held)
    assert held[:6] == [q for q in first if q not in training]  # the order of the split, as validation reads it
    everything = {r["question"] for r in generate_problems("chain_sum", 256, 0, "test", OPTIONS)}
    with pytest.raises(InputError, match="outside the training set") as raised:
        held_out_problems("chain_sum", 4, 0, OPTIONS, everything)
    assert "--n-test" in (raised.value.hint or "")


def test_the_continue_command_trains_as_the_demo_did() -> None:
    cfg = _demo_config(options(n_test=6, overrides=("batch_size=2",)))
    cfg = dataclasses.replace(
        cfg, feedback=dataclasses.replace(cfg.feedback, inter=dataclasses.replace(cfg.feedback.inter, scorer="j|v2"))
    )
    sets = demo_overrides(cfg, options(n_test=6, overrides=("batch_size=2",)))
    assert sets == [
        "feedback.p_t=0.75",
        "feedback.inter.scorer=j|v2",
        f"eval.dataset={cfg.data.dataset}-test",
        "eval.n=6",
        "batch_size=2",
    ]
    again = load_config(recipe_path("demo-cpu.toml"), [*sets, f"run_name={cfg.run_name}"])
    assert (again.feedback, again.eval, again.batch_size) == (cfg.feedback, cfg.eval, cfg.batch_size)
