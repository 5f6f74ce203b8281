"""Prompt templates: versions, headers, and the leakage property (reflection prompts never reveal a judgement)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo import feedback_modes, prompts


@dataclass
class Attempt:
    """Everything the store knows about an attempt; the prompt must only read `response`."""

    response: str
    reward: float
    correct: bool
    gold_answer: str


def _text(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def test_templates_carry_no_judgement_words() -> None:
    for template in (prompts.INTRA, prompts.INTER, prompts.SYSTEM, prompts.ACTOR):
        for word in prompts.JUDGEMENT_WORDS:
            assert not re.search(rf"\b{re.escape(word)}", template, re.IGNORECASE), (word, template[:40])


def test_versions_and_modes() -> None:
    assert feedback_modes.version_of("intra") == prompts.INTRA_VERSION
    assert feedback_modes.version_of("zero_shot") == prompts.ACTOR_VERSION
    with pytest.raises(ValueError):
        feedback_modes.version_of("self_correct_typo")
    assert feedback_modes.build_messages("intra", "Q?", []) == prompts.actor_messages("Q?")


def test_render_context_numbers_items() -> None:
    text = feedback_modes.render_context(
        "intra", [Attempt("first try", 0.0, False, "9"), Attempt("second", 1.0, True, "9")]
    )
    assert text == "### Attempt 1\nfirst try\n\n### Attempt 2\nsecond"
    with pytest.raises(ValueError):
        feedback_modes.render_context("zero_shot", [])


def test_headers_must_appear_in_order() -> None:
    assert prompts.has_headers("## Review\nx\n## Solution\ny", prompts.INTRA_HEADERS)
    assert not prompts.has_headers("## Solution\ny\n## Review\nx", prompts.INTRA_HEADERS)
    assert not prompts.has_headers("## Review only", prompts.INTRA_HEADERS)


# Responses are drawn from text that cannot contain the gold marker, digits of rewards, or judgement words,
# so anything of those kinds in the prompt could only have come from the template or a leaked field.
SAFE_TEXT = st.text(alphabet="abcdefhkmnpqsuvxyz +-*=()\n", max_size=60)


@settings(max_examples=150, deadline=None)
@given(
    question=SAFE_TEXT.filter(lambda s: s.strip() != ""),
    history=st.lists(
        st.tuples(SAFE_TEXT, st.floats(min_value=-5, max_value=5, allow_nan=False), st.booleans()), max_size=6
    ),
    gold=st.integers(min_value=1000, max_value=10**9),
)
def test_reflection_prompt_never_leaks_gold_reward_or_correctness(question: str, history, gold: int) -> None:
    attempts = [Attempt(text, reward, correct, f"G{gold}") for text, reward, correct in history]
    text = _text(prompts.intra_messages(question, attempts))
    assert str(gold) not in text
    for attempt in attempts:
        if attempt.reward not in (0.0, 1.0):  # "1" / "0" occur in "Attempt 1"; other reprs are distinctive
            assert repr(attempt.reward) not in text
    for word in prompts.JUDGEMENT_WORDS:
        assert not re.search(rf"\b{re.escape(word)}", text, re.IGNORECASE), word
    for attempt in attempts:
        assert attempt.response.strip() in text
