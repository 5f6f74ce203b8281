"""MEL's templates: versions and headers, parsing a diagnosis, and leakage. The diagnosis may say which attempt is
correct (that is the method) but never shows a reward or the gold answer; the lesson is cleaned so that replay and
inter prompts carry no gold answer, no reward and no number of the problem."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo import feedback_modes, prompts
from lanpo.mel import prompts as mel_prompts
from lanpo.mel.bifurcation import split_steps
from lanpo.mel.prompts import (
    DIAGNOSIS_HEADERS,
    MASK,
    clean_lesson,
    diagnosis_messages,
    mask_answer,
    parse_diagnosis,
    replay_messages,
)


def _text(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


GOOD = """## Bifurcation
Step 3
## Mistake
Attempt B added 7 + 5 and wrote 13; attempt A wrote 12.
## Principle
Carry the tens digit when a column sums past 9.
## Heuristic
Re-add each column from the right before moving on."""


def test_versions_headers_and_templates() -> None:
    assert mel_prompts.DIAGNOSIS_VERSION.startswith("mel-diagnosis-v")
    assert mel_prompts.REPLAY_VERSION.startswith("mel-replay-v")
    assert DIAGNOSIS_HEADERS == ("## Bifurcation", "## Mistake", "## Principle", "## Heuristic")
    for header in DIAGNOSIS_HEADERS:
        assert header in mel_prompts.DIAGNOSIS
    assert mel_prompts.has_lesson_headers(GOOD) and not mel_prompts.has_lesson_headers("## Mistake\nx")
    # the replay prompt is the actor's, with working memory: no word that would judge an attempt or reveal a grade
    for word in prompts.JUDGEMENT_WORDS:
        assert not re.search(rf"\b{re.escape(word)}", mel_prompts.REPLAY, re.IGNORECASE), word
    assert "\\boxed{N}" in _text(replay_messages("Q?", "a lesson long enough to keep"))


def test_diagnosis_prompt_numbers_steps_and_states_the_hint_or_the_step() -> None:
    positive, negative = split_steps("a\nb\nc"), split_steps("a\nx")
    hinted = _text(diagnosis_messages("What is 2 + 2?", positive, negative, 2, given=False))
    assert "### Attempt A\n[1] a\n[2] b\n[3] c" in hinted and "### Attempt B\n[1] a\n[2] x" in hinted
    assert "first differ at step 2 of attempt B" in hinted and "Attempt A is correct; attempt B is not." in hinted
    given_ = _text(diagnosis_messages("Q", positive, negative, 2, given=True))
    assert "Attempt B goes astray at step 2." in given_ and "first differ" not in given_


def test_parse_diagnosis() -> None:
    parsed = parse_diagnosis(GOOD, negative_steps=4)
    assert parsed.step == 3 and parsed.lesson.startswith("## Mistake") and parsed.lesson.endswith("moving on.")
    assert parse_diagnosis(GOOD, negative_steps=2).step is None  # step 3 does not exist in a 2-step negative
    assert parse_diagnosis("## Bifurcation: Step 0\n## Mistake\nxyz", 5).step is None
    assert parse_diagnosis("## bifurcation step 2\nthe rest is a lesson", 5) == mel_prompts.Diagnosis(
        2, "the rest is a lesson"
    )
    free = "No headers at all, just a thought about carrying digits."
    assert parse_diagnosis(free, 3) == mel_prompts.Diagnosis(None, free)


def test_clean_lesson_masks_numbers_and_the_gold_answer() -> None:
    lesson = clean_lesson(parse_diagnosis(GOOD, 4).lesson, "12")
    assert lesson is not None and not re.search(r"\d", lesson) and "N + N" in lesson
    kept = clean_lesson("Step 2 of 3: the result 12 is 1.5 times 8", "12", mask_numbers=False)
    assert kept == "Step 2 of 3: the result N is 1.5 times 8"
    assert mask_answer("x = y is the answer; x = yes", "x = y") == "N is the answer; x = yes"
    assert mask_answer("the forty-two and fortyish", "forty") == "the N-two and fortyish"
    assert clean_lesson("  too short  ", "1") is None and clean_lesson("\x00" * 30, None) is None
    assert MASK == "N"


SAFE = st.text(alphabet="abcdefhkmnpqsuvxyz +-*=()#\n", max_size=80)


@settings(max_examples=200, deadline=None)
@given(
    question=SAFE.filter(lambda s: s.strip() != ""),
    before=SAFE,
    after=SAFE,
    gold=st.integers(min_value=10, max_value=10**9),
    reward=st.floats(min_value=-5, max_value=5, allow_nan=False),
    mask_numbers=st.booleans(),
)
def test_replay_and_inter_prompts_never_carry_the_gold_answer_or_a_reward(
    question: str, before: str, after: str, gold: int, reward: float, mask_numbers: bool
) -> None:
    # a diagnosis that repeats the gold answer and a reward value: the worst a model could write
    diagnosis = f"## Bifurcation\nStep 1\n## Mistake\n{before} {gold} {after}\n## Principle\nreward {reward}\n"
    lesson = clean_lesson(parse_diagnosis(diagnosis, 3).lesson, str(gold), mask_numbers)
    assert lesson is not None
    if mask_numbers:
        assert not re.search(r"\d", lesson)  # no number of the problem, no reward value, survives
    for text in (_text(replay_messages(question, lesson)), feedback_modes.render_context("inter", [_Lesson(lesson)])):
        assert not re.search(rf"(?<!\d){gold}(?!\d)", text)  # the gold answer, as a number, is gone
        if mask_numbers:
            assert str(gold) not in text and repr(reward) not in text


class _Lesson:
    """An inter-sample item as the pool serves a meta-experience: its summary is the cleaned lesson."""

    def __init__(self, summary: str) -> None:
        self.summary = summary


def test_diagnosis_prompt_takes_no_reward_or_gold_argument() -> None:
    # the builder reads the question and the two step lists only: a reward or the gold answer has no way in
    import inspect

    assert list(inspect.signature(diagnosis_messages).parameters) == [
        "question",
        "positive_steps",
        "negative_steps",
        "step",
        "given",
    ]
    assert list(inspect.signature(replay_messages).parameters) == ["question", "lesson"]
