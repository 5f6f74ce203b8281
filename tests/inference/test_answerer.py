"""The answerer end to end on a tiny random model and the real store: modes, fallbacks, errors, leakage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from lanpo import prompts
from lanpo.db.repo.problems import Question
from lanpo.errors import ConfigError, InputError
from lanpo.inference.answerer import EMPTY_POOL, Answerer
from lanpo.inference.config import RetrievalSettings
from lanpo.models import LoraSpec, adapter_sha256, attach_lora, tiny_causal_lm

from .conftest import EXPERIENCE_REWARD, ScriptedBackend, question_text, scripted_expectation


def test_zero_shot_k_samples_and_grading(make_answerer: Callable[..., Answerer]) -> None:
    answerer = make_answerer()
    answerer.backend = ScriptedBackend(answerer.tokenizer)
    qs = [Question(str(q), question_text(q, 2, q), str(q + 2)) for q in range(5)] + [
        Question("nogold", question_text(1, 1, 9))
    ]
    solutions = answerer.solve(qs, "zero-shot", 3)
    assert [s.mode for s in solutions] == ["zero_shot"] * 6
    for s in solutions[:5]:
        assert len(s.samples) == 3 and all(len(x.turns) == 1 for x in s.samples)
        assert s.mean_correct == pytest.approx(scripted_expectation(int(s.question.external_id), 3))
        assert s.samples[0].final.prompt_version == prompts.ACTOR_VERSION
    ungraded = solutions[5]
    assert ungraded.mean_correct is None and ungraded.samples[0].final.correct is None
    assert ungraded.samples[0].final.reward is None
    assert ungraded.samples[0].final.answer == "2" or ungraded.samples[0].final.answer == "3"  # boxed, extracted
    # answers are stored as text and counts: the engine is asked for no token log-probs (vllm reports them only then)
    assert answerer.backend.params and not any(p.logprobs for p in answerer.backend.params)


def test_tiny_model_generates_every_mode(make_answerer: Callable[..., Answerer], pool: dict[str, Any]) -> None:
    answerer = make_answerer()
    qs = ["What is 2+3?", "What is 4+4?", "What is 1+9?", "What is 5+5?"]
    for mode in ("zero_shot", "retrieval", "self_correct"):
        solutions = answerer.solve(qs, mode, 2)
        assert len(solutions) == 4
        for s in solutions:
            assert len(s.samples) == 2
            for sample in s.samples:
                for t in sample.turns:
                    assert 0 < t.completion_tokens <= 8 and t.prompt_tokens > 0
                    assert t.finish_reason in ("stop", "length")
                    assert t.prompt.endswith("<|im_start|>assistant\n")
            record = s.to_record()
            assert record["mode"] == mode and len(record["answers"]) == 2


def test_self_correct_keeps_both_turns_and_reflects_on_the_first(make_answerer: Callable[..., Answerer]) -> None:
    answerer = make_answerer()
    solutions = answerer.solve([Question("a", "What is 2+3?", "5")], "self-correct-single", 3)
    assert solutions[0].mode == "self_correct_single"
    for sample in solutions[0].samples:
        first, second = sample.turns
        assert first.prompt_version == prompts.ACTOR_VERSION and second.prompt_version == prompts.INTRA_VERSION
        assert first.response.strip() in second.prompt  # the reflection reads this sample's own first answer
        assert "earlier attempts" in second.prompt
        assert sample.final is second


def test_retrieval_uses_pool_and_records_experiences(
    make_answerer: Callable[..., Answerer], pool: dict[str, Any]
) -> None:
    answerer = make_answerer()
    q = Question("new", "How does addition work for 2 and 3?", "5")
    (s,) = answerer.solve([q], "retrieval", 2)
    assert s.fallback is None and 1 <= len(s.experiences) <= 2
    assert {e.experience_version_id for e in s.experiences} <= set(pool["version_ids"])
    prompt = s.samples[0].final.prompt
    assert s.samples[0].final.prompt_version == prompts.INTER_VERSION
    for e in s.experiences:
        assert e.summary in prompt and e.relevance is None  # scorer none: stage 1 only
    assert answerer.notes == []


def test_retrieval_excludes_the_questions_own_problem(
    make_answerer: Callable[..., Answerer], pool: dict[str, Any]
) -> None:
    answerer = make_answerer(retrieval=RetrievalSettings(stage1="bm25", top_k=8, gamma=0.0, m=8, judge="none"))
    own = pool["problem_ids"][0]
    text = "addition multiplication fractions percentages"
    (s,) = answerer.solve([Question("0", text, "1", problem_id=own)], "retrieval", 1)
    assert len(s.experiences) == 3 and own not in {e.source_problem_id for e in s.experiences}


def test_retrieval_with_llm_rerank_and_gamma(make_answerer: Callable[..., Answerer], pool: dict[str, Any]) -> None:
    keep_all = make_answerer(retrieval=RetrievalSettings(stage1="bm25", top_k=4, gamma=0.0, m=2, judge="policy"))
    (s,) = keep_all.solve(["addition and multiplication of 2 and 3"], "retrieval", 1)
    assert len(s.experiences) == 2
    assert all(e.relevance is not None and 0 <= e.relevance <= 1 for e in s.experiences)
    assert s.experiences[0].relevance >= s.experiences[1].relevance  # best first
    none_pass = make_answerer(retrieval=RetrievalSettings(stage1="bm25", top_k=4, gamma=1.0, m=2, judge="policy"))
    (s,) = none_pass.solve(["addition and multiplication of 2 and 3"], "retrieval", 1)
    assert s.experiences == [] and "gamma=1.0" in (s.fallback or "")
    assert s.samples[0].final.prompt_version == prompts.ACTOR_VERSION
    assert any("1 of 1 question(s) had no experience" in n for n in none_pass.notes)


def test_empty_pool_falls_back_to_zero_shot_and_says_so(
    make_answerer: Callable[..., Answerer], committed: Any
) -> None:
    from lanpo.config import StoreConfig
    from lanpo.db.repo.pools import ensure_pool

    with pytest.raises(InputError, match="no experience pool yet"):
        make_answerer().solve(["What is 2+3?"], "retrieval", 1)
    with committed() as session:
        ensure_pool(session, "fresh", StoreConfig())
    answerer = make_answerer()
    solutions = answerer.solve(["What is 2+3?", "What is 1+1?"], "retrieval", 1)
    assert all(s.fallback == EMPTY_POOL and s.experiences == [] for s in solutions)
    assert all(s.samples[0].final.prompt_version == prompts.ACTOR_VERSION for s in solutions)
    assert len(answerer.notes) == 1 and "empty pool" in answerer.notes[0] and "2 question" in answerer.notes[0]
    assert solutions[0].to_record()["fallback"] == EMPTY_POOL


def test_retrieval_without_database_is_a_clear_error(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    answerer = Answerer(model, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="needs a database"):
        answerer.solve(["What is 1+1?"], "retrieval", 1)


def test_bad_mode_and_missing_adapter_are_clear_errors(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = tiny
    with pytest.raises(InputError, match="does not exist"):
        Answerer(model, adapter=tmp_path / "nope", tokenizer=tokenizer)
    with pytest.raises(InputError, match="holds no PEFT adapter"):
        Answerer(model, adapter=tmp_path, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="unknown inference mode"):
        Answerer(model, tokenizer=tokenizer).solve(["q"], "best-of-n", 1)
    with pytest.raises(ConfigError, match="unknown backend"):
        Answerer(model, tokenizer=tokenizer, backend="tgi")


def test_adapter_is_loaded_and_hashed(tmp_path: Path) -> None:
    base, tokenizer = tiny_causal_lm(seed=3)
    peft_model = attach_lora(base, LoraSpec(rank=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # a non-zero update, so the adapter changes what the model says
    expected = adapter_sha256(peft_model)
    peft_model.save_pretrained(tmp_path / "adapter")
    fresh, _ = tiny_causal_lm(seed=3)
    answerer = Answerer(fresh, adapter=tmp_path / "adapter", tokenizer=tokenizer)
    assert answerer.adapter_sha256 == expected
    assert answerer.judge_model_id.endswith(expected[:12])
    (s,) = answerer.solve(["What is 1+1?"], "zero_shot", 1)
    assert s.samples[0].final.completion_tokens > 0


# --------------------------------------------------------------------------- leakage (property)

marker = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=8, max_size=12)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gold=marker, question=st.text(alphabet="abcdefghij +-*/?0123456789", min_size=1, max_size=40))
def test_prompts_never_carry_gold_reward_or_relevance(
    make_answerer: Callable[..., Answerer], pool: dict[str, Any], session: Session, gold: str, question: str
) -> None:
    """Self-correct and retrieval prompts (every turn) hold no gold answer, reward or relevance score."""
    if not question.strip():
        question = "What is 1+1?"
    answerer = make_answerer(retrieval=RetrievalSettings(stage1="bm25", top_k=4, gamma=0.0, m=2, judge="policy"))
    q = Question("q", question + " addition and multiplication", gold)
    for mode in ("self_correct", "retrieval"):
        (s,) = answerer.solve([q], mode, 2)
        for sample in s.samples:
            for turn in sample.turns:
                assert gold not in turn.prompt
                assert str(EXPERIENCE_REWARD) not in turn.prompt
                for word in ("reward", "correct", "gold"):
                    assert word not in turn.prompt.lower().replace(question.lower(), "")
                for e in s.experiences:
                    assert f"{e.relevance}" not in turn.prompt and f"{e.relevance:.2f}" not in turn.prompt


def test_the_fallback_names_what_left_the_prompt_without_lessons() -> None:
    """Without a judge no gamma filters anything: the reason is stage 1's, never `gamma=0.9`."""
    from lanpo.inference.modes import nothing_relevant

    unjudged = nothing_relevant(RetrievalSettings(judge="none"))
    assert "gamma=" not in unjudged and "stage 1 (bm25) found no experience" in unjudged
    assert "gamma=0.9" in nothing_relevant(RetrievalSettings(judge="policy"))
    assert "rank = value" in nothing_relevant(RetrievalSettings(judge="none", rank="value"))
