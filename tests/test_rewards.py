"""Rewards: strict boxed correctness (math-verify), grader failures, the feedback-mode format bonus."""

from __future__ import annotations

import logging

import pytest

from lanpo import rewards
from lanpo.rewards import correctness_reward, extract_boxed, format_reward, grade


def test_boxed_answers_are_graded_by_value() -> None:
    completions = ["so \\boxed{42}", "\\boxed{41}", "\\boxed{\\frac{1}{2}}", "\\boxed{42.0}", "x \\boxed{-3} ."]
    assert correctness_reward(completions, ["42", "42", "0.5", "42", "-3"]) == [1.0, 0.0, 1.0, 1.0, 1.0]


def test_unboxed_trailing_number_gets_no_credit_although_math_verify_accepts_it() -> None:
    from math_verify import parse, verify

    text = "adding them up the result is 42"
    assert verify(parse("$42$"), parse(text))  # the lenient grader would pay for this
    assert correctness_reward([text], "42") == [0.0]  # ours does not: the answer must be boxed


def test_last_box_wins_and_braces_balance() -> None:
    assert extract_boxed("\\boxed{1} then \\boxed{x^{2}+1}") == "x^{2}+1"
    assert extract_boxed("\\boxed{7} and an unclosed \\boxed{8") == "7"
    assert extract_boxed("\\boxed{}") is None
    assert extract_boxed("no box") is None
    assert correctness_reward(["\\boxed{5} wait, \\boxed{6}"], "6") == [1.0]


def test_grader_exception_gives_zero_and_a_warning(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def boom(predicted: str, gold: str) -> bool:
        raise TimeoutError("grader hung")

    monkeypatch.setattr(rewards, "answers_match", boom)
    with caplog.at_level(logging.WARNING, logger="lanpo.rewards"):
        assert correctness_reward(["\\boxed{3}"], "3") == [0.0]
    assert "grader failed" in caplog.text


def test_missing_gold_is_never_correct() -> None:
    assert correctness_reward(["\\boxed{3}"], None) == [0.0]


def test_format_bonus_only_for_feedback_modes_with_headers() -> None:
    intra_ok = "## Review\nthe sum was off\n## Solution\n1+2=3 \\boxed{3}"
    inter_ok = "## Relevance\nlesson 1\n## Plan\nadd\n## Solution\n\\boxed{3}"
    out = format_reward(
        [intra_ok, intra_ok, inter_ok, inter_ok, "## Solution\n## Review"],
        ["intra", "zero_shot", "inter", "intra", "intra"],
    )
    assert out == [0.1, 0.0, 0.1, 0.0, 0.0]


def test_grade_combines_parts() -> None:
    graded = grade(["## Review\nok\n## Solution\n\\boxed{3}", "\\boxed{4}"], ["3", "3"], ["intra", "zero_shot"])
    assert graded[0].reward == pytest.approx(1.1) and graded[0].correct and graded[0].format_ok
    assert graded[1].reward == 0.0 and not graded[1].correct and not graded[1].format_ok
