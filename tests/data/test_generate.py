"""`lanpo data gen`: reasoning-gym problems in the import format, seeded, with disjoint train/test seeds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lanpo.data.generate import SPLIT_STRIDE, generate_problems, split_seed
from lanpo.errors import InputError


def test_split_seeds_are_disjoint() -> None:
    assert split_seed(0, "train") == 0 and split_seed(0, "test") == SPLIT_STRIDE
    ranges = [(split_seed(s, sp), split_seed(s, sp) + SPLIT_STRIDE) for s in range(4) for sp in ("train", "test")]
    for i, (lo, hi) in enumerate(ranges):
        for lo2, hi2 in ranges[i + 1 :]:
            assert hi <= lo2 or hi2 <= lo
    with pytest.raises(InputError, match="split"):
        split_seed(0, "valid")


def test_generate_is_seeded_and_keeps_the_solution() -> None:
    a = generate_problems("gsm_symbolic", 3, seed=5)
    assert a == generate_problems("gsm_symbolic", 3, seed=5)
    assert a != generate_problems("gsm_symbolic", 3, seed=6)
    assert [r["id"] for r in a] == ["gsm_symbolic-train-5-0", "gsm_symbolic-train-5-1", "gsm_symbolic-train-5-2"]
    assert all(r["solution"].rstrip().endswith(f"#### {r['answer']}") for r in a)
    assert a[0]["task"] == "gsm_symbolic" and a[0]["source"]["source_dataset"] == "gsm_symbolic"
    test = generate_problems("gsm_symbolic", 3, seed=5, split="test")
    assert {r["question"] for r in test}.isdisjoint({r["question"] for r in a})


def test_task_options_and_errors() -> None:
    rows = generate_problems("chain_sum", 20, seed=1, options={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    assert all(r["source"]["num_terms"] == 2 for r in rows)
    with pytest.raises(InputError, match="unknown reasoning-gym task 'nope'"):
        generate_problems("nope", 2)
    with pytest.raises(InputError, match="rejected the options"):
        generate_problems("chain_sum", 2, options={"bogus": 1})


def test_gen_then_import_cli(tmp_path: Path, run_cli: Callable) -> None:
    out = tmp_path / "p.jsonl"
    gen = run_cli(
        "data",
        "gen",
        "--task",
        "basic_arithmetic",
        "--n",
        "5",
        "--seed",
        "2",
        "--out",
        out,
        "--task-option",
        "max_terms=3",
    )
    assert gen.code == 0, gen.err
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 5 and {"id", "question", "answer", "task", "split"} <= set(lines[0])
    imported = run_cli("data", "import", out, "--dataset", "arith")
    assert imported.code == 0 and "5 inserted" in imported.out
    stats = run_cli("pool", "stats", "--dataset", "arith")
    assert "problems:              5" in stats.out
