"""JSONL question files (clear errors for malformed input) and the mean@k table maths."""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanpo.errors import InputError
from lanpo.inference.io import question_id, read_questions, write_jsonl
from lanpo.inference.table import mean_at_k


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text(text)
    return path


def test_reads_ids_answers_and_metadata(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"id": 7, "question": "What is 2+3?", "answer": 5, "level": "easy"}\n\n{"question": "What is 1+1?"}\n',
    )
    first, second = read_questions(path)
    assert (first.external_id, first.answer, first.metadata) == ("7", "5", {"level": "easy"})
    assert (
        second.external_id == question_id("What is 1+1?") and second.answer is None and len(second.external_id) == 16
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"question": "ok"}\n{"question": "x"\n', r"q.jsonl:2: not valid JSON"),
        ('["a list"]\n', r"q.jsonl:1: expected a JSON object, got list"),
        ('{"id": 1}\n', r"q.jsonl:1: 'question' must be a non-empty string"),
        ('{"question": "   "}\n', r"'question' must be a non-empty string"),
        ('{"question": "a", "answer": [1]}\n', r"'answer' must be a string or a number, got list"),
        ('{"question": "a", "id": true}\n', r"'id' must be a string or a number, got bool"),
        ('{"id": "a", "question": "x"}\n{"id": "a", "question": "y"}\n', r"q.jsonl:2: id 'a' already used on line 1"),
        ("\n\n", r"holds no questions"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_questions(write(tmp_path, text))


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_questions(tmp_path / "absent.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(InputError, match="not UTF-8"):
        read_questions(tmp_path / "bin.jsonl")


def test_write_jsonl_round_trips(tmp_path: Path) -> None:
    records = [{"id": "1", "answers": ["\\frac{1}{2}", None]}, {"id": "ü"}]
    assert write_jsonl(tmp_path / "sub" / "out.jsonl", records) == 2
    lines = (tmp_path / "sub" / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == records


# --------------------------------------------------------------------------- mean@k


def reference_mean_at_k(outcomes: list[tuple[str, str, int, bool]]) -> dict[tuple[str, str], float]:
    """The definition, written plainly: per problem the fraction correct, then the mean over problems."""
    out: dict[tuple[str, str], float] = {}
    for mode, dataset in {(m, d) for m, d, _, _ in outcomes}:
        problems = sorted({p for m, d, p, _ in outcomes if (m, d) == (mode, dataset)})
        fractions = []
        for p in problems:
            answers = [c for m, d, q, c in outcomes if (m, d, q) == (mode, dataset, p)]
            fractions.append(sum(answers) / len(answers))
        out[(mode, dataset)] = sum(fractions) / len(fractions)
    return out


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["zero_shot", "retrieval"]), st.sampled_from(["a", "b"]), st.integers(0, 5), st.booleans()
        ),
        min_size=1,
        max_size=60,
    )
)
def test_mean_at_k_matches_the_definition(outcomes: list[tuple[str, str, int, bool]]) -> None:
    table = mean_at_k(outcomes, ["zero_shot", "retrieval"], ["a", "b"])
    expected = reference_mean_at_k(outcomes)
    assert set(table.cells) == set(expected)
    for key, value in expected.items():
        assert table.cells[key].mean == pytest.approx(value)
    for mode in ("zero_shot", "retrieval"):
        row = [expected[(mode, d)] for d in ("a", "b") if (mode, d) in expected]
        assert table.average(mode) == (pytest.approx(sum(row) / len(row)) if row else None)


def test_table_rendering_is_shaped_like_table_1() -> None:
    rng = random.Random(0)
    outcomes = [
        (m, d, p, rng.random() < 0.5)
        for m in ("zero_shot", "self_correct")
        for d in ("gsm", "math")
        for p in range(3)
        for _ in range(4)
    ]
    table = mean_at_k(outcomes, ["zero_shot", "self_correct", "retrieval"], ["gsm", "math"], k=4)
    rows = table.rows()
    assert rows[0] == ["mean@4", "gsm", "math", "Average"]
    assert [r[0] for r in rows[1:]] == ["Zero-shot", "Self-correct", "Retrieval"]
    assert rows[3][1:] == ["-", "-", "-"]  # a mode that was not run
    gsm = table.cells[("zero_shot", "gsm")]
    assert rows[1][1] == f"{100 * gsm.mean:.1f}" and gsm.problems == 3 and gsm.samples == 12
    md = table.to_markdown().splitlines()
    assert md[0] == "| mean@4 | gsm | math | Average |" and md[1].startswith("| --- | ---:")
    parsed = list(csv.DictReader(io.StringIO(table.to_csv())))
    assert {(r["mode"], r["dataset"]) for r in parsed} == {
        ("zero_shot", "gsm"),
        ("zero_shot", "math"),
        ("zero_shot", "average"),
        ("self_correct", "gsm"),
        ("self_correct", "math"),
        ("self_correct", "average"),
    }
    avg = next(r for r in parsed if r["mode"] == "zero_shot" and r["dataset"] == "average")
    assert float(avg["mean_at_k"]) == pytest.approx(table.average("zero_shot"), abs=1e-6)
