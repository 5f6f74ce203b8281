"""`lanpo infer --backend vllm --mode retrieval --judge policy`: one engine answers and judges, no HF model loads.

The CLI's engine runs in float32 here, so its judge can be held to the HF judge with the same adapter exactly
(1e-4): the vLLM scorer computes the same r(p, c); the bf16 difference is bounded in test_judge.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from lanpo.config import StoreConfig
from lanpo.db.repo.experiences import NewExperience, add_experiences
from lanpo.db.repo.pools import ensure_pool
from lanpo.db.repo.problems import Question, upsert_problems
from lanpo.models import load_adapter, load_causal_lm
from lanpo.retrieval.judge import PROMPT_VERSION, HFJudge
from tests.vllm_engine.helpers import SavedAdapter, needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]

LESSONS = (  # each shares words with the questions, so that BM25 finds them all
    "To add two numbers, add the tens first, then the ones.",
    "To multiply numbers, repeat the addition and count the terms.",
    "For percentages of numbers, divide by 100 before multiplying.",
)


def fill_pool(session: Session) -> None:
    upsert_problems(session, "train", [Question(str(i), f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(3)])
    ids = list(session.scalars(sa.text("SELECT id FROM problems ORDER BY id")))
    pool = ensure_pool(session, "trained", StoreConfig())
    add_experiences(session, pool, [NewExperience(pid, text, 1.0) for pid, text in zip(ids, LESSONS, strict=True)])
    session.commit()


def test_infer_retrieval_answers_and_judges_on_one_engine(
    run_cli: Any,
    session: Session,
    smollm2_dir: Path,
    adapters: list[SavedAdapter],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = adapters[0]
    hf_model, tokenizer = load_causal_lm(smollm2_dir, device="cpu", dtype="float32")  # before the ban below
    hf_judge = HFJudge(load_adapter(hf_model, adapter.path), tokenizer, model_id="hf")

    def no_hf_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the vllm backend loaded a HF model")

    monkeypatch.setattr("lanpo.models.load_causal_lm", no_hf_model)
    monkeypatch.setattr("lanpo.retrieval.judge.load_judge", no_hf_model)
    fill_pool(session)
    questions = tmp_path / "quiz.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"Add the numbers {i} and 12."}) + "\n" for i in (3, 4))
    )
    out = tmp_path / "answers.jsonl"
    r = run_cli(
        *("infer", "--model", smollm2_dir, "--adapter", adapter.path, "--mode", "retrieval", "--judge", "policy"),
        *("--input", questions, "--out", out, "--samples", "2", "--max-new-tokens", "16", "--gamma", "0"),
        *("--stage1", "bm25", "--top-k", "3", "--m", "2", "--backend", "vllm"),
        *("--vllm", "max_model_len=2048", "--vllm", "max_lora_rank=16", "--dtype", "float32"),
    )
    assert r.code == 0, r.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(rec["samples"]) for rec in records] == [2, 2]
    assert all(len(rec["experiences"]) == 2 and rec["fallback"] is None for rec in records)
    for rec in records:  # the judge was the policy the engine served: base model + adapter
        relevance = [e["relevance"] for e in rec["experiences"]]
        expected = hf_judge.score([(rec["question"], e["summary"]) for e in rec["experiences"]])
        assert relevance == pytest.approx(expected, abs=1e-4)
    served = set(session.scalars(sa.text("SELECT served_adapter_sha256 FROM attempts")))
    assert served == {adapter.sha256}  # every stored attempt names the adapter that answered it
    scorers = set(session.scalars(sa.text("SELECT scorer FROM relevance_scores")))
    assert scorers == {f"{smollm2_dir}+{adapter.sha256[:12]}|{PROMPT_VERSION}"}
    (config,) = session.scalars(sa.text("SELECT config FROM runs WHERE kind = 'infer'"))
    assert config["backend"] == "vllm" and config["vllm"]["max_lora_rank"] == 16
