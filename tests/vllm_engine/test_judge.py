"""The relevance judge on the engine agrees with the HF judge on the same model, and refuses a changed adapter."""

from __future__ import annotations

from typing import Any

import pytest

from lanpo.errors import LanpoError
from lanpo.retrieval.judge import PROMPT_VERSION, HFJudge
from lanpo.retrieval.vllm_judge import VLLMJudge
from tests.vllm_engine.helpers import SavedAdapter, needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]

PROBLEMS = (
    "What is 12 + 30?",
    "A train travels 60 km in 1.5 hours. What is its average speed?",
    "Solve 3x + 4 = 19 for x.",
)
FEEDBACK = (
    "Add the tens first, then the ones, and check the sum by subtracting.",
    "Speed is distance divided by time; keep the units.",
    "Isolate x: subtract the constant from both sides, then divide by the coefficient.",
    "The capital of France is Paris.",
    "Check units when dividing a distance by a time.",
)
PAIRS = [(p, f) for p in PROBLEMS for f in FEEDBACK]

# The session engine computes in bf16, the HF judge in fp32. In fp32 the engine's judge equals the HF judge to 1e-4
# (test_infer_cli.py; measured: 5e-5), so what remains here is bf16 rounding: 8 significant bits, i.e. 0.2% per
# rounding, compounded over 30 layers to ~1% of each logit (magnitude 10-25 here), so l_yes - l_no may move by
# 0.3-0.4, and a score, sigmoid(l_yes - l_no) with slope <= 1/4, by up to ~0.1. Measured on these 15 pairs: max
# 0.03-0.07, mean 0.01-0.02 (with and without LoRA slots).
TOLERANCE = 0.1


def test_the_engine_judge_agrees_with_the_hf_judge(backend: Any, hf_smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = hf_smollm2
    hf = HFJudge(model, tokenizer, model_id="smollm2").score(PAIRS)
    judge = VLLMJudge(backend, model_id="smollm2")
    assert judge.identity == f"smollm2|{PROMPT_VERSION}" == HFJudge(model, tokenizer, "smollm2").identity
    on_engine = judge.score(PAIRS, batch_size=4)  # several engine calls, in input order
    diffs = [abs(a - b) for a, b in zip(hf, on_engine, strict=True)]
    assert max(diffs) < TOLERANCE and sum(diffs) / len(diffs) < TOLERANCE / 3, diffs
    alone = judge.score(PAIRS[3:4] + PAIRS[:1])  # in input order, whatever the batch
    assert alone == pytest.approx([on_engine[3], on_engine[0]], abs=0.02)


def test_the_judge_is_pinned_to_the_adapter_it_was_built_on(backend: Any, adapters: list[SavedAdapter]) -> None:
    backend.set_adapter(adapters[0].path)
    judge = VLLMJudge(backend, model_id=f"smollm2+{adapters[0].sha256[:12]}")
    assert judge.adapter_sha256 == adapters[0].sha256 and len(judge.score(PAIRS[:2])) == 2
    backend.set_adapter(None)
    with pytest.raises(LanpoError, match="the judge was built on adapter"):
        judge.score(PAIRS[:2])
