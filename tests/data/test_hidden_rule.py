"""`hidden_rule`: lanpo's generated transfer task (lanpo.data.hidden_rule), through `generate_problems`."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from lanpo.data.generate import generate_problems
from lanpo.data.hidden_rule import FAMILIES, split_pairs
from lanpo.errors import InputError
from lanpo.rewards import is_correct

# Written here from the task's description, not imported: the rule of each land.
REFERENCE: dict[str, Callable[[int, int], int]] = {
    "Zorvia": lambda a, b: sum([a] * b),
    "Quellan": lambda a, b: b + a,
    "Brimmor": lambda a, b: 1 + b + a,
    "Tessaly": lambda a, b: sum([b] * a) + 1,
    "Vornish": lambda a, b: 10 + a + b,
    "Kelpa": lambda a, b: -(b - a),
}
QUESTION = re.compile(r"^In (\w+), a ⊙ b is computed by the \1 rule\. What is (\d+) ⊙ (\d+)\?$")


def test_seeded_and_deterministic() -> None:
    a = generate_problems("hidden_rule", 30, seed=3)
    assert a == generate_problems("hidden_rule", 30, seed=3)
    assert [r["question"] for r in a] != [r["question"] for r in generate_problems("hidden_rule", 30, seed=4)]
    assert [r["id"] for r in a[:2]] == ["hidden_rule-train-3-0", "hidden_rule-train-3-1"]
    assert a[0]["task"] == "hidden_rule" and a[0]["split"] == "train"


def test_answers_follow_each_lands_rule_and_grade_with_math_verify() -> None:
    for split in ("train", "test"):
        for record in generate_problems("hidden_rule", 60, seed=1, split=split):
            land, a, b = QUESTION.match(record["question"]).groups()  # type: ignore[union-attr]
            assert land == record["family"] == record["source"]["family"]
            assert record["answer"] == str(REFERENCE[land](int(a), int(b)))
    for record in generate_problems("hidden_rule", 6, seed=0, split="test"):  # as the reward reads a completion
        right = REFERENCE[record["family"]](record["source"]["a"], record["source"]["b"])
        assert is_correct(f"So it is \\boxed{{{right}}}.", record["answer"])
        assert not is_correct(f"So it is \\boxed{{{right + 1}}}.", record["answer"])
    for family in FAMILIES:  # the rule text a lesson quotes says what `apply` does
        for a, b in [(1, 2), (7, 4), (12, 10)]:
            assert eval(family.rule, {}, {"a": a, "b": b}) == family.apply(a, b) == REFERENCE[family.name](a, b)


def test_families_differ_and_take_turns() -> None:
    records = generate_problems("hidden_rule", 24, seed=0, split="test")
    assert Counter(r["family"] for r in records) == {f.name: 4 for f in FAMILIES}
    grid = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    tables = {name: tuple(rule(a, b) for a, b in grid) for name, rule in REFERENCE.items()}
    assert len(set(tables.values())) == len(FAMILIES)  # no two lands share a rule on the operand range
    two = generate_problems("hidden_rule", 6, seed=0, options={"families": 2})
    assert [r["family"] for r in two] == ["Zorvia", "Quellan"] * 3


def test_the_rule_is_in_no_field_a_prompt_reads() -> None:
    rules = [f.rule for f in FAMILIES] + ["*", "+", "rule:", "="]
    for record in generate_problems("hidden_rule", 60, seed=2) + generate_problems("hidden_rule", 60, 2, "test"):
        shown = {k: v for k, v in record.items() if k not in ("answer",)}
        text = json.dumps(shown, ensure_ascii=False)
        assert not any(rule in text for rule in rules), text
        assert "solution" not in record  # no worked solution for the SFT warm start to teach the rule from


def test_splits_are_disjoint_and_hold_the_same_families() -> None:
    train = generate_problems("hidden_rule", 400, seed=0)
    for seed in (0, 1, 7):
        test = generate_problems("hidden_rule", 200, seed=seed, split="test")
        assert {r["question"] for r in test}.isdisjoint({r["question"] for r in train})
        assert {r["family"] for r in test} == {r["family"] for r in train}
    for family in FAMILIES:  # the two splits partition each family's pairs, a quarter held out
        held, kept = split_pairs(family, 1, 9, "test"), split_pairs(family, 1, 9, "train")
        assert sorted(held + kept) == [(a, b) for a in range(1, 10) for b in range(1, 10)] and len(held) == 20
    tiny = generate_problems("hidden_rule", 6, seed=0, split="test", options={"min_operand": 1, "max_operand": 2})
    assert all(r["question"] for r in tiny)  # one held-out pair per family even on a 2 x 2 grid


def test_a_split_repeats_a_question_only_once_its_pairs_are_used() -> None:
    test = generate_problems("hidden_rule", 6 * 20, seed=5, split="test")
    assert len({r["question"] for r in test}) == 6 * 20
    assert len({r["question"] for r in generate_problems("hidden_rule", 6 * 21, seed=5, split="test")}) == 6 * 20


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"families": 7}, "families must be between 1 and 6"),
        ({"min_operand": 3, "max_operand": 3}, "min_operand < max_operand"),
        ({"colour": 1}, "unknown hidden_rule option"),
        ({"families": 2.5}, "must be integers"),
    ],
)
def test_bad_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        generate_problems("hidden_rule", 2, options=options)


def test_gen_then_import_groups_by_family_in_sql(tmp_path: Path, run_cli: Callable) -> None:
    out = tmp_path / "h.jsonl"
    gen = run_cli("data", "gen", "--task", "hidden_rule", "--n", "12", "--split", "test", "--out", out)
    assert gen.code == 0, gen.err
    assert json.loads(out.read_text().splitlines()[0])["id"] == "hidden_rule-test-0-0"
    assert run_cli("data", "import", out, "--dataset", "hidden_rule-val").code == 0
    query = "SELECT metadata->>'family' AS family, count(*) AS n FROM problems GROUP BY 1 ORDER BY 1"
    table = run_cli("sql", query, "--format", "csv")
    assert table.code == 0, table.err
    assert table.out.split() == ["family,n", *sorted(f"{f.name},2" for f in FAMILIES)]
