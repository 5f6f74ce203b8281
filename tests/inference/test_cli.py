"""`lanpo infer` and `lanpo eval` end to end on a tiny model saved as a HF folder, against the test database."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo.pools import ensure_pool
from lanpo.inference.answerer import EMPTY_POOL

FAST = ("--max-new-tokens", "6", "--temperature", "1.0", "--batch-size", "2")


def questions_file(tmp_path: Path, with_answers: bool = True) -> Path:
    path = tmp_path / "quiz.jsonl"
    rows = [{"id": f"q{i}", "question": f"What is {i}+{i}?"} for i in range(3)]
    if with_answers:
        for i, row in enumerate(rows):
            row["answer"] = str(2 * i)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_infer_zero_shot_writes_answers_and_stores_the_run(
    run_cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path, session: Session
) -> None:
    out = tmp_path / "answers.jsonl"
    r = run_cli(
        "infer",
        "--model",
        tiny_dir,
        "--mode",
        "zero-shot",
        "--input",
        questions_file(tmp_path),
        "--out",
        out,
        "--samples",
        "2",
        *FAST,
    )
    assert r.code == 0, r.err
    records = read(out)
    assert [x["id"] for x in records] == ["q0", "q1", "q2"]
    assert all(x["mode"] == "zero_shot" and len(x["samples"]) == 2 and x["gold"] is not None for x in records)
    assert all(x["mean_correct"] is not None for x in records)
    assert "wrote 3 answers" in r.err and "mean@2" in r.err
    run = session.execute(sa.text("SELECT id, kind, status, config FROM runs")).one()
    assert (run.kind, run.status, run.config["dataset"]) == ("infer", "finished", "infer-quiz")
    attempts = session.execute(sa.text("SELECT dataset, external_id, mode FROM run_attempts")).all()
    assert len(attempts) == 6 and {a.dataset for a in attempts} == {"infer-quiz"}
    assert {x["problem_id"] for x in records} == set(session.scalars(sa.text("SELECT id FROM problems")))


def test_infer_self_correct_without_gold_and_without_store(
    run_cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path, session: Session
) -> None:
    out = tmp_path / "answers.jsonl"
    r = run_cli(
        "infer",
        "--model",
        tiny_dir,
        "--mode",
        "self-correct",
        "--input",
        questions_file(tmp_path, False),
        "--out",
        out,
        "--no-store",
        *FAST,
    )
    assert r.code == 0, r.err
    for x in read(out):
        (sample,) = x["samples"]
        first, second = sample["turns"]
        assert x["gold"] is None and x["mean_correct"] is None and sample["correct"] is None
        assert first["response"].strip() in second["prompt"]
    assert session.scalar(sa.text("SELECT count(*) FROM runs")) == 0


def test_infer_retrieval_on_an_empty_pool_says_so(
    run_cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path, session: Session
) -> None:
    out = tmp_path / "answers.jsonl"
    args = ("infer", "--model", tiny_dir, "--mode", "retrieval", "--input", questions_file(tmp_path), "--out", out)
    none = run_cli(*args, *FAST)
    assert none.code == 2 and "no experience pool yet" in none.err and not out.exists()
    ensure_pool(session, "fresh", StoreConfig())
    session.commit()
    r = run_cli(*args, *FAST)
    assert r.code == 0, r.err
    assert "empty pool" in r.err and "3 answered zero-shot (fallback)" in r.err
    assert all(x["fallback"] == EMPTY_POOL and x["experiences"] == [] for x in read(out))


def test_infer_errors_are_clear(run_cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path) -> None:
    good = questions_file(tmp_path)
    r = run_cli(
        "infer",
        "--model",
        tiny_dir,
        "--adapter",
        tmp_path / "missing",
        "--mode",
        "zero-shot",
        "--input",
        good,
        "--out",
        tmp_path / "o.jsonl",
    )
    assert r.code == 2 and "error: adapter folder" in r.err and "does not exist" in r.err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "fine"}\n{"question": \n')
    r = run_cli("infer", "--model", tiny_dir, "--mode", "zero-shot", "--input", bad, "--out", tmp_path / "o.jsonl")
    assert r.code == 2 and "bad.jsonl:2: not valid JSON" in r.err and "Traceback" not in r.err
    r = run_cli(
        "infer", "--model", tmp_path / "nomodel", "--mode", "zero-shot", "--input", good, "--out", tmp_path / "o.jsonl"
    )
    assert r.code == 2 and "does not exist" in r.err
    # the same ids with other text in the same dataset are refused, not overwritten
    assert (
        run_cli(
            "infer", "--model", tiny_dir, "--mode", "zero-shot", "--input", good, "--out", tmp_path / "o.jsonl", *FAST
        ).code
        == 0
    )
    good.write_text('{"id": "q0", "question": "Something else?"}\n')
    r = run_cli("infer", "--model", tiny_dir, "--mode", "zero-shot", "--input", good, "--out", tmp_path / "o.jsonl")
    assert r.code == 2 and "already holds problem(s) q0" in r.err and "--dataset" in r.err


def test_eval_cli_prints_and_writes_the_table(
    run_cli: Callable[..., Any], tiny_dir: Path, tmp_path: Path, session: Session
) -> None:
    questions_file(tmp_path)
    cfg = tmp_path / "eval.toml"
    cfg.write_text(
        f'model = "{tiny_dir}"\nrun_name = "cli-eval"\nout_dir = "{tmp_path / "out"}"\nk_samples = 2\n'
        'modes = ["zero_shot", "self_correct"]\n'
        '[[datasets]]\nname = "quiz"\nfile = "quiz.jsonl"\n'
        "[sampling]\nmax_new_tokens = 6\ntemperature = 1.0\n"
    )
    r = run_cli("eval", "--config", cfg, "--no-progress", "--set", "batch_size=2")
    assert r.code == 0, r.err
    assert "| mean@2 | quiz | Average |" in r.out and "| Zero-shot |" in r.out and "| Self-correct |" in r.out
    assert (tmp_path / "out" / "table.md").read_text() in r.out
    assert (tmp_path / "out" / "table.csv").read_text().startswith("mode,dataset,mean_at_k,problems,samples")
    assert session.scalar(sa.text("SELECT count(*) FROM attempts")) == 3 * 2 + 3 * 2 * 2
    r = run_cli("eval", "--config", cfg, "--set", "k_samples=0")
    assert r.code == 2 and "k_samples must be >= 1" in r.err


@pytest.mark.slow
def test_infer_with_smollm2_self_correct(run_cli: Callable[..., Any], tmp_path: Path, session: Session) -> None:
    """The real offline model: two turns per question, the second reflecting on the first, both stored."""
    path = tmp_path / "real.jsonl"
    path.write_text('{"id": "a", "question": "What is 12 + 30?", "answer": "42"}\n')
    out = tmp_path / "answers.jsonl"
    r = run_cli(
        "infer",
        "--model",
        "smollm2",
        "--mode",
        "self-correct",
        "--input",
        path,
        "--out",
        out,
        "--max-new-tokens",
        "24",
        "--temperature",
        "0",
    )
    assert r.code == 0, r.err
    (record,) = read(out)
    first, second = record["samples"][0]["turns"]
    assert first["completion_tokens"] > 0 and second["completion_tokens"] > 0
    assert first["response"].strip() and first["finish_reason"] in ("stop", "length")
    assert "## Review" in second["prompt"] and first["response"].strip() in second["prompt"]
    steps = sorted(session.scalars(sa.text("SELECT step FROM run_attempts WHERE mode = 'self_correct'")))
    assert steps == [0, 1]
