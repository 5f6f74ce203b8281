"""The summariser through the engine: one batched call, one checked summary per candidate, seeded."""

from __future__ import annotations

from typing import Any

import pytest

from lanpo.feedback.summarize import Candidate, summarise
from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]

CANDIDATES = [
    Candidate(0, 1, "What is 12 + 30?", "12 + 30: add the tens, 10 + 30 = 40, then 2 more. \\boxed{42}", 1.1),
    Candidate(3, 2, "What is 7 * 6?", "Seven sixes: 6 + 6 + 6 + 6 + 6 + 6 + 6 = 42. \\boxed{42}", 1.0),
]


def test_summaries_come_from_the_engine(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, SamplingParams]] = []
    generate = backend.generate

    def counted(prompts: list[str], n: int, params: SamplingParams) -> Any:
        calls.append((len(prompts), n, params))
        return generate(prompts, n, params)

    monkeypatch.setattr(backend, "generate", counted)
    first = summarise(backend, backend.tokenizer, CANDIDATES, max_new_tokens=64, temperature=0.7, seed=5)
    again = summarise(backend, backend.tokenizer, CANDIDATES, max_new_tokens=64, temperature=0.7, seed=5)
    assert [c[:2] for c in calls] == [(2, 1), (2, 1)]  # one batched call per step
    assert len(first) == 2 and first == again  # seeded: the same lessons
    assert any(len(s.text) >= 20 for s in first)  # checked summaries: admitted or not, each says why


def test_a_scaffolded_summary_through_the_engine(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lanpo import prompts
    from lanpo.feedback.summarize import SECTION_STOP

    calls: list[SamplingParams] = []
    generate = backend.generate

    def counted(prompts_: list[str], n: int, params: SamplingParams) -> Any:
        calls.append(params)
        return generate(prompts_, n, params)

    monkeypatch.setattr(backend, "generate", counted)
    checked = summarise(backend, backend.tokenizer, CANDIDATES, 96, 0.7, seed=5, scaffold=True)
    assert len(calls) == 3 and all(p.stop == SECTION_STOP and p.max_new_tokens == 32 for p in calls)
    for summary in checked:
        sections = prompts.summary_sections(summary.text)
        assert [name for name, _ in sections] == ["flow", "principles", "pitfalls"]  # the code's headers, in order
        assert all("\n\n" not in body for _, body in sections)  # each body ended at a blank line or a heading
        assert summary.format_ok == prompts.has_summary_format(summary.text)
