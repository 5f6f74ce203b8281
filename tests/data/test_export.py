"""`lanpo data export --format verl`: verl's RLHF parquet from a fresh store, every column read back against the
store, no gold answer in any prompt; bad input refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lanpo import prompts
from lanpo.cli import main
from lanpo.db.connection import transaction
from lanpo.db.repo import problems as problems_repo
from lanpo.db.repo.problems import Question
from tests.fresh_store import fresh_store

# Gold answers that appear in no question, so that a leak into a prompt would show.
PROBLEMS = [
    {"id": "a", "question": "What is 17 + 25?", "answer": "42", "task": "add"},
    {"id": "b", "question": "Solve 3x = 21 for x.", "answer": "7"},
    {"id": "c", "question": "What is 123 * 4?", "answer": "492"},
]


@pytest.fixture
def new_store(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new user's store: an empty LANPO_HOME and an empty database, migrated by the first command."""
    with fresh_store(pg_url, tmp_path / "home") as env:
        for key in ("LANPO_HOME", "LANPO_DATABASE_URL"):
            monkeypatch.setenv(key, env[key])
        yield env["LANPO_DATABASE_URL"]


def _lanpo(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_export_verl_reads_back_as_the_store_holds_it(
    new_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS), encoding="utf-8")
    out = tmp_path / "train.parquet"
    code, _, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--out", out)  # before any import
    assert code == 2 and "unknown dataset 'toy'" in err and not out.exists()
    assert _lanpo(capsys, "data", "import", source, "--dataset", "toy")[0] == 0

    code, said, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--format", "verl", "--out", out)
    assert code == 0, err
    assert said.strip() == f"toy: wrote 3 problems (verl, split train) to {out}"
    assert not list(tmp_path.glob(".train.parquet.tmp-*"))

    engine = sa.create_engine(new_store, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT id, external_id, question, answer FROM problems WHERE dataset = 'toy' ORDER BY id")
        ).all()
    engine.dispose()
    table = pq.read_table(out)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    assert len(rows) == len(stored) == 3
    for index, (row, problem) in enumerate(zip(rows, stored, strict=True)):
        assert row["data_source"] == "lanpo/toy"
        assert row["ability"] == "math"
        assert row["prompt"] == prompts.actor_messages(problem.question)  # lanpo's zero-shot messages, exactly
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["reward_model"] == {"style": "rule", "ground_truth": problem.answer}
        assert row["extra_info"] == {
            "problem_id": problem.id,
            "dataset": "toy",
            "external_id": problem.external_id,
            "index": index,
            "split": "train",
        }
        assert all(problem.answer not in message["content"] for message in row["prompt"])

    # verl's RLHFDataset reads the file with `datasets.load_dataset("parquet", ...)["train"]`: the same rows come back.
    import datasets

    read = datasets.load_dataset("parquet", data_files=str(out), cache_dir=str(tmp_path / "hf-cache"))["train"]
    assert list(read) == rows

    code, said, _ = _lanpo(
        capsys, "data", "export", "--dataset", "toy", "--out", tmp_path / "t.parquet", "--split", "test"
    )
    assert code == 0 and {r["extra_info"]["split"] for r in pq.read_table(tmp_path / "t.parquet").to_pylist()} == {
        "test"
    }


def test_export_refuses_bad_input_and_writes_nothing(
    new_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS), encoding="utf-8")
    assert _lanpo(capsys, "db", "upgrade")[0] == 0
    imported = _lanpo(capsys, "data", "import", source, "--dataset", "toy")
    assert imported[0] == 0, imported[2]
    engine = sa.create_engine(new_store, poolclass=sa.pool.NullPool)
    with transaction(engine) as session:  # a problem without a gold answer: the repository API allows one
        problems_repo.upsert_problems(session, "toy", [Question("open", "Is it?", None)])
    engine.dispose()

    out = tmp_path / "train.parquet"
    code, _, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--out", out)
    assert code == 2 and "1 problem(s) of 'toy' have no gold answer: open" in err and "hint:" in err
    assert not out.exists() and not list(tmp_path.glob(".*tmp-*"))

    code, _, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--out", tmp_path / "train.jsonl")
    assert code == 2 and "must end in .parquet" in err
    code, _, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--out", tmp_path / "no" / "x.parquet")
    assert code == 2 and "does not exist" in err
    code, _, err = _lanpo(capsys, "data", "export", "--dataset", "toy", "--format", "trl", "--out", out)
    assert code == 2 and "invalid value for '--format'" in err
    assert not out.exists()

    out.write_bytes(b"the old file")  # a failed export leaves an existing file as it was
    code, _, _ = _lanpo(capsys, "data", "export", "--dataset", "toy", "--out", out)
    assert code == 2 and out.read_bytes() == b"the old file"
