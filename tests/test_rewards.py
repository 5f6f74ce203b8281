"""Rewards: strict boxed correctness (math-verify), grader failures, the feedback-mode format bonus."""

from __future__ import annotations

import logging

import pytest

from lanpo import rewards
from lanpo.prompts import INTER_HEADERS, has_headers
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
        "3",
    )
    assert out == [0.1, 0.0, 0.1, 0.0, 0.0]


def test_format_bonus_needs_the_boxed_answer_too() -> None:
    # The responses the 135M policy really wrote in the CPU experiment's inter groups: headers, answer unboxed.
    unboxed = [
        "## Relevance (the pattern)\n## Plan (the steps)\n## Solution 9 9 The answer is 9.",
        "## Relevance\nlesson 2\n## Plan\nadd\n## Solution\n6 + 9 = 15. The answer is \\text{15}.",
        "## Relevance\n## Plan\n## Solution\n6 + 9 = \\boxed{15",  # cut off by max_new_tokens: unclosed
    ]
    assert all(has_headers(text, INTER_HEADERS) for text in unboxed)  # the headers alone would have paid
    assert format_reward(unboxed, "inter", ["9", "15", "15"]) == [0.0, 0.0, 0.0]
    assert format_reward(["## Review\nfine\n## Solution\n2 + 2 = 4. The answer is 4."], "intra", "4") == [0.0]


def test_format_bonus_is_paid_only_on_correct_answers() -> None:
    # What the policy learnt next, in the intra groups of seed 1: echo the prompt's template, placeholder boxed.
    echo = (
        "## Review (what the attempts did, step by step, and what to do differently) "
        "## Solution (your own full solution, ending with \\boxed{N})"
    )
    echo = echo.replace(" ## Solution", "\n## Solution")
    wrong_formatted = "## Review\nthe sum was off\n## Solution\n44 + 27 = 61 \\boxed{61}"
    right_formatted = "## Review\nthe sum was off\n## Solution\n44 + 27 = 71 \\boxed{71}"
    right_plain = "44 + 27 = 71 \\boxed{71}"
    graded = grade([echo, wrong_formatted, right_formatted, right_plain], ["71"] * 4, ["intra"] * 4)
    assert [g.format_ok for g in graded] == [True, True, True, False]  # the format is recorded as it is...
    assert [g.reward for g in graded] == [0.0, 0.0, pytest.approx(1.1), 1.0]  # ...and paid only when right
    # A group where nothing is right has no reward spread left to learn the template from.
    assert len({g.reward for g in graded[:2]}) == 1
    parts = [
        c + f
        for c, f in zip(
            correctness_reward([echo, right_formatted], "71"),
            format_reward([echo, right_formatted], "intra", "71"),
            strict=True,
        )
    ]
    assert parts == [g.reward for g in (graded[0], graded[2])]  # the TRL-style parts sum to the total


def test_grade_combines_parts() -> None:
    graded = grade(["## Review\nok\n## Solution\n\\boxed{3}", "\\boxed{4}"], ["3", "3"], ["intra", "zero_shot"])
    assert graded[0].reward == pytest.approx(1.1) and graded[0].correct and graded[0].format_ok
    assert graded[1].reward == 0.0 and not graded[1].correct and not graded[1].format_ok


# The paper's rule, LANPO appendix 10.3 (../shared/papers/000_*.txt): "The model receives a +0.1 bonus if its generated
# text contains certain predefined headers" (Table 6: "Correctness Reward Plus Format Reward").
WRONG_FORMATTED = "## Review\nthe sum was off\n## Solution\n44 + 27 = 61 \\boxed{61}"
RIGHT_FORMATTED = "## Review\nthe sum was off\n## Solution\n44 + 27 = 71 \\boxed{71}"
HEADERS_UNBOXED = "## Review\nthe sum was off\n## Solution\n44 + 27 = 71"
RIGHT_PLAIN = "44 + 27 = 71 \\boxed{71}"


@pytest.mark.parametrize(
    ("rule", "rewards_by_case"),
    [
        # wrong + headers, right + headers, headers without a box, right without headers, zero-shot wrong + headers
        ("paper", [0.1, 1.1, 0.1, 1.0, 0.0]),
        ("correct_only", [0.0, 1.1, 0.0, 1.0, 0.0]),
    ],
)
def test_both_format_rules_on_hand_cases(rule: str, rewards_by_case: list[float]) -> None:
    texts = [WRONG_FORMATTED, RIGHT_FORMATTED, HEADERS_UNBOXED, RIGHT_PLAIN, WRONG_FORMATTED]
    modes = ["intra", "intra", "intra", "intra", "zero_shot"]
    graded = grade(texts, ["71"] * 5, modes, rule)
    assert [g.reward for g in graded] == pytest.approx(rewards_by_case)
    assert [g.correct for g in graded] == [False, True, False, True, False]
    parts = [
        c + f for c, f in zip(correctness_reward(texts, "71"), format_reward(texts, modes, "71", rule), strict=True)
    ]
    assert parts == pytest.approx(rewards_by_case)  # the TRL-style parts sum to the total under either rule
    assert rewards.reward_of(False, True, rule) == pytest.approx(rewards_by_case[0])


def test_the_paper_rule_pays_what_appendix_10_3_says() -> None:
    """+0.1 (lanpo/papers.toml, quoted from the paper) for the headers, whatever the answer: the bonus a group with
    nothing right can be gamed by; correct_only never pays a wrong answer."""
    from lanpo import papers

    bonus = papers.values("lanpo")["format_bonus"]
    assert rewards.FORMAT_BONUS == bonus == 0.1
    inter = "## Relevance\nlesson 1\n## Plan\nadd\n## Solution\nthe answer is 9"
    assert format_reward([inter, inter], ["inter", "zero_shot"], None, "paper") == [bonus, 0.0]
    assert format_reward([inter], "inter", "9", "correct_only") == [0.0]
    with pytest.raises(ValueError, match="unknown format rule"):
        grade([inter], ["9"], ["inter"], "headers")
