"""`lanpo data import FILE --preset NAME`: each benchmark's published layout imports from its fixture; bad gold
answers and conflicting duplicates are refused and listed, and nothing is half-written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.data.presets import PRESETS, gold_parses, normalise_answer, read_rows, rows_to_problems, strip_dapo_wrapper
from lanpo.db.repo.problems import problems_of_dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# preset -> (fixture, problems it holds, one (question fragment, stored gold answer))
EXPECTED = {
    "dapo17k": ("dapo17k.parquet", 3, ("divisors of 12", "28")),
    "math500": ("math500.jsonl", 3, ("Simplify", "\\frac{3}{4}")),
    "aime24": ("aime24.parquet", 3, ("3 distinct books", "6")),
    "aime25": ("aime25.jsonl", 3, ("x^2", "49")),
    "amc23": ("amc23.jsonl", 4, ("one half of 1.5", "0.75")),
    "olympiadbench": ("olympiadbench.parquet", 4, ("y^2 = 2", "\\sqrt{2}")),
}


def test_every_preset_has_a_fixture() -> None:
    assert set(EXPECTED) == set(PRESETS)


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_preset_imports_its_fixture(preset: str, run_cli: Callable[..., Any], session: Session) -> None:
    name, count, (fragment, gold) = EXPECTED[preset]
    result = run_cli("data", "import", FIXTURES / name, "--preset", preset)
    assert result.code == 0, result.err
    problems = problems_of_dataset(session, preset)
    assert len(problems) == count
    (row,) = [p for p in problems if fragment in p.question]
    assert row.answer == gold
    for p in problems:
        assert "Answer:" not in p.question and "step by step" not in p.question  # lanpo's templates, not theirs
        assert gold_parses(p.answer)
    again = run_cli("data", "import", FIXTURES / name, "--preset", preset)  # idempotent
    assert again.code == 0 and f"0 inserted, {count} unchanged" in again.out


def test_dapo_copies_fold_and_both_layouts_agree(run_cli: Callable[..., Any], session: Session) -> None:
    raw = run_cli("data", "import", FIXTURES / "dapo17k.parquet", "--preset", "dapo17k")
    assert raw.code == 0 and "6 duplicate row(s) folded" in raw.out
    processed = run_cli(
        "data", "import", FIXTURES / "dapo17k-processed.parquet", "--preset", "dapo17k", "--dataset", "dapo-processed"
    )
    assert processed.code == 0, processed.err
    pairs = {(p.question, p.answer) for p in problems_of_dataset(session, "dapo17k")}
    assert pairs == {(p.question, p.answer) for p in problems_of_dataset(session, "dapo-processed")}
    first = problems_of_dataset(session, "dapo17k")[0]
    assert first.external_id == "uuid-0-0" and "prompt" not in first.metadata["source"]


def test_the_dapo_wrapper_is_cut_to_the_bare_problem() -> None:
    row = next(iter(read_rows(FIXTURES / "dapo17k.parquet")))
    wrapped = row["prompt"][0]["content"]
    assert wrapped.startswith("Solve the following") and wrapped.endswith('after "Answer:".')
    assert strip_dapo_wrapper(wrapped) == "Find the sum of all positive divisors of 12."
    assert strip_dapo_wrapper("Just a problem.") == "Just a problem."


@pytest.mark.parametrize(
    ("value", "stored"),
    [(27.0, "27"), (0.75, "0.75"), (34, "34"), ("$\\frac{1}{2}$", "\\frac{1}{2}"), ("  7 ", "7")],
)
def test_answers_are_normalised_as_the_grader_reads_them(value: object, stored: str) -> None:
    assert normalise_answer(value) == stored


def test_unparsable_gold_and_conflicting_copies_are_listed_and_nothing_is_written(
    tmp_path: Path, run_cli: Callable[..., Any], session: Session
) -> None:
    rows = [
        {"problem": "What is 2 + 2?", "answer": "4", "unique_id": "a"},
        {"problem": "What is 3 + 3?", "answer": "\\frac{", "unique_id": "b"},  # math-verify cannot parse it
        {"problem": "What is 5 + 5?", "answer": "", "unique_id": "c"},
        {"problem": "What is 6 + 6?", "unique_id": "d"},
    ]
    path = tmp_path / "math500.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("data", "import", path, "--preset", "math500")
    assert result.code == 2 and "3 bad rows" in result.err and "nothing was imported" in result.err
    assert f"{path}:row 2: math-verify cannot parse the gold answer" in result.err
    assert f"{path}:row 3: the answer is empty" in result.err
    assert f"{path}:row 4: none of the fields answer is present" in result.err
    assert session.scalar(sa.text("SELECT count(*) FROM problems")) == 0
    skipped = run_cli("data", "import", path, "--preset", "math500", "--skip-bad")
    assert skipped.code == 0 and "1 inserted" in skipped.out and "3 bad row(s) skipped" in skipped.out

    dapo = list(read_rows(FIXTURES / "dapo17k.parquet"))
    conflict = {**dapo[0], "reward_model": {"ground_truth": "29", "style": "x"}}
    pq.write_table(pa.Table.from_pylist([*dapo, conflict]), tmp_path / "dapo.parquet")
    good, bad, folded, count = rows_to_problems(PRESETS["dapo17k"], read_rows(tmp_path / "dapo.parquet"))
    assert (len(good), folded, count) == (3, 6, 10)
    assert [b.line for b in bad] == [10] and "same question as row 1 with another answer" in bad[0].reason


def test_a_preset_needs_no_dataset_name_but_plain_jsonl_does(run_cli: Callable[..., Any]) -> None:
    result = run_cli("data", "import", FIXTURES / "aime25.jsonl")
    assert result.code == 2 and "--dataset is required without --preset" in result.err
