"""Use diagnostics on hand-made responses (an answer-only reply, one that copies its lesson, one that ignores it, one
with the prompt's sections and one without), values checked exactly; their per-mode means in the step's metrics,
through `group_records` as every trainer builds them; and no prompt builder can read them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lanpo import diagnostics, feedback_modes, prompts
from lanpo.db.repo.contexts import InterItem, IntraItem
from lanpo.diagnostics import answer_copied, answer_only, echo, reasoning_words, sections, shingles
from lanpo.feedback.contexts import StepPrompts
from lanpo.feedback.record import GroupRecord, RolloutRecord, group_records, rollout_metrics
from lanpo.prompts import OMITTED
from lanpo.rewards import Graded
from lanpo.rollout import Completion

QUESTION = "Triangle ABC has area 30. Point D lies on BC with BD:DC = 2:1. What is the area of triangle ABD?"
# 34 words ("flow", "principles" and "pitfalls" among them), all 30 of its 5-word shingles distinct
LESSON = (
    "## Flow\nSet up a coordinate system and write each point as a vector.\n"
    "## Principles\nCompare areas through ratios of segments on the same line.\n"
    "## Pitfalls\nDo not mix up the order of the vertices."
)
COPIES = (  # the whole lesson, then its own solution
    f"## Relevance\nThe lesson applies:\n{LESSON}\n## Plan\nUse the ratio.\n"
    "## Solution\nABD has 2/3 of the base BC and the same height, so 2/3 of 30 is \\boxed{20}."
)
ONE_SENTENCE = (  # one sentence of the lesson (10 words: 6 of its 30 shingles), the rest its own words
    "## Relevance\nThe lesson says: compare areas through ratios of segments on the same line.\n## Plan\nratio\n"
    "## Solution\nBD is two thirds of BC, so ABD has 2/3 of 30, \\boxed{20}."
)
IGNORES = (  # the paper's collapse: a solution from scratch, the lesson unread, no sections
    "The heights from A are equal, so the areas are in the ratio of the bases 2:1. "
    "Hence ABD has area 30 * 2 / 3 = 20.\n\\boxed{20}"
)
BARE = "The answer is \\boxed{20}."
SIGN_OFF = "Final Answer: The final answer is \\boxed{20}. I hope it is correct."  # 11 words
TERSE = "48 / 2 = 24 clips in May. 48 + 24 = 72 clips in total. \\boxed{72}"  # 12 words: reasoning


def test_shingles_are_lowercased_word_runs_within_one_text() -> None:
    assert shingles("A b, C\\frac{d}{e}") == {("a", "b", "c", "frac", "d"), ("b", "c", "frac", "d", "e")}
    assert shingles("only four words here") == set()
    marker = OMITTED.format(n=120)
    assert shingles(f"one two three\n{marker}\nfour five") == {("one", "two", "three", "four", "five")}


def test_echo_of_a_copy_a_sentence_and_an_ignored_lesson() -> None:
    assert len(shingles(LESSON)) == 30
    assert echo(COPIES, [LESSON], QUESTION) == 1.0
    assert echo(ONE_SENTENCE, [LESSON], QUESTION) == 6 / 30
    assert echo(IGNORES, [LESSON], QUESTION) == 0.0
    # two items: their shingles pooled (never across the two), the copy of one is half of them when equal in size
    other = "Draw the altitude from the apex and read off both heights at once"  # 13 words, 9 shingles
    assert echo(COPIES, [LESSON, other], QUESTION) == 30 / 39
    assert echo(COPIES, ["too short to shingle"], QUESTION) == 0.0  # under 5 words: no shingle, echo 0
    assert echo(COPIES, [], QUESTION) == 0.0


def test_echo_leaves_out_what_the_question_already_says() -> None:
    earlier = f"{QUESTION} The base ratio gives 20. \\boxed{{20}}"  # an intra item: an earlier attempt restating it
    restates = f"{QUESTION}\nSolving it afresh: \\boxed{{20}}"
    assert echo(restates, [earlier], QUESTION) == 0.0
    with_question = len(shingles(earlier) & shingles(restates)) / len(shingles(earlier))
    assert with_question == 18 / 25  # what echo would say if restating the 22-word problem counted


def test_sections_follow_the_modes_prompt_whatever_the_answer() -> None:
    assert sections(COPIES, "inter") and sections(ONE_SENTENCE, "retrieval")
    assert not sections(IGNORES, "inter")
    assert not sections("## Plan\nx\n## Relevance\ny\n## Solution\n\\boxed{3}", "inter")  # out of order
    review = "## Review\nThe first attempt added instead of dividing.\n## Solution\n\\boxed{7}"  # wrong, formatted
    assert sections(review, "intra") and sections(review, "self_correct")  # REFLECT asks for intra's headers
    assert not sections(review, "inter")
    assert not sections(review, "zero_shot")  # no sections asked


@pytest.mark.parametrize(
    ("mode", "template"),
    [
        ("intra", prompts.INTRA),
        ("inter", prompts.INTER),
        ("retrieval", prompts.INTER),
        ("self_correct", prompts.REFLECT),
    ],
)
def test_the_sections_checked_are_the_ones_the_prompt_asks_for(mode: str, template: str) -> None:
    asked = [line for line in template.splitlines() if line.startswith("## ")]
    assert tuple(asked) == feedback_modes.required_headers(mode)


@pytest.mark.parametrize(
    ("response", "mode", "words", "expected"),
    [
        (BARE, "zero_shot", 3, True),
        (SIGN_OFF, "zero_shot", 11, True),
        (TERSE, "zero_shot", 12, False),
        ("## Relevance\n## Plan\n## Solution\n\\boxed{20}", "inter", 0, True),  # the headers are no reasoning
        ("## Relevance\nnone\n## Plan\nadd\n## Solution\n\\boxed{\\frac{1}{2}}", "inter", 2, True),
        ("The answer is 20.", "zero_shot", 4, False),  # no boxed answer: not an answer-only reply
        (IGNORES, "inter", 26, False),
        (COPIES, "inter", 58, False),
    ],
)
def test_answer_only(response: str, mode: str, words: int, expected: bool) -> None:
    assert reasoning_words(response, mode) == words
    assert answer_only(response, mode) is expected
    assert diagnostics.ANSWER_ONLY_WORDS == 12  # the rule's N, argued in lanpo.diagnostics


def test_answer_copied_from_an_earlier_attempt() -> None:
    earlier = ["I think it is \\boxed{ 20 }", "Or \\boxed{15}"]
    assert answer_copied("so \\boxed{20}", earlier)
    assert not answer_copied("so \\boxed{25}", earlier)
    assert not answer_copied("so 20", earlier)  # no final answer, nothing copied
    assert not answer_copied("so \\boxed{20}", [LESSON])  # a lesson without a boxed answer


def _rollout(text: str) -> RolloutRecord:
    return RolloutRecord(text, 1.0, True, True, 10, False)


def test_use_metrics_are_per_mode_means_over_the_rollouts() -> None:
    groups = [
        GroupRecord(1, "zero_shot", "p", 4, [], [_rollout(BARE), _rollout(TERSE), _rollout(IGNORES)]),
        GroupRecord(2, "inter", "p", 4, [], [_rollout(COPIES), _rollout(BARE)], context_texts=[LESSON]),
        GroupRecord(3, "inter", "p", 4, [], [_rollout(ONE_SENTENCE), _rollout(IGNORES)], context_texts=[LESSON]),
        GroupRecord(4, "intra", "p", 4, [], [_rollout(BARE), _rollout(TERSE)], context_texts=["first \\boxed{20}"]),
    ]
    metrics = rollout_metrics(groups)
    use = {name: value for name, value in metrics.items() if name.startswith("use/")}
    assert use == {
        "use/answer_only/zero_shot": 1 / 3,
        "use/sections/inter": 2 / 4,  # COPIES, ONE_SENTENCE
        "use/echo/inter": (1.0 + 0.0 + 6 / 30 + 0.0) / 4,
        "use/answer_only/inter": 1 / 4,  # BARE
        "use/answer_copied/inter": 0.0,  # the lesson has no boxed answer
        "use/sections/intra": 0.0,
        "use/echo/intra": 0.0,  # its item has two words: no shingle
        "use/answer_only/intra": 1 / 2,
        "use/answer_copied/intra": 1 / 2,  # BARE's 20 is the earlier attempt's
    }  # no retrieval or self_correct rollouts: no metric for them


def test_group_records_carry_the_item_texts_as_shown() -> None:
    cut = f"head of it\n{OMITTED.format(n=50)}\ntail \\boxed{{7}}"  # an item cut to fit: shown cut
    prompts = StepPrompts(
        [1, 2, 3], ["q1", "q2", "q3"], ["1", "2", "7"], ["zero_shot", "inter", "intra"],
        ["zero_shot", "inter", "intra"], ["t1", "t2", "t3"],
        [[], [InterItem(5, 9, LESSON, 0.95)], [IntraItem(8, cut)]], 1, k=1, drawn=[0, 1, 1], truncated=[0, 0, 1],
    )  # fmt: skip
    completions = [[Completion(text, (1, 2), (3,), "stop")] for text in (BARE, COPIES, "again \\boxed{7}")]
    graded = [Graded(1.0, True, False)] * 3
    rows = group_records(prompts, completions, graded, {})
    assert [(r.context_texts, r.question) for r in rows] == [([], "q1"), ([LESSON], "q2"), ([cut], "q3")]
    metrics = rollout_metrics(rows)
    assert (metrics["use/echo/inter"], metrics["use/answer_copied/intra"]) == (1.0, 1.0)


PROMPT_BUILDERS = ("lanpo/prompts.py", "lanpo/feedback_modes.py", "lanpo/feedback/contexts.py", "lanpo/mel/prompts.py")


@pytest.mark.parametrize("path", PROMPT_BUILDERS)
def test_no_prompt_builder_imports_the_diagnostics(path: str) -> None:
    """Diagnostics describe answers; a prompt never shows them (as it never shows a reward or a verdict)."""
    source = Path(__file__).resolve().parents[1] / path
    tree = ast.parse(source.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert not [n for n in names if "diagnostics" in n], names


def test_the_declared_use_metrics_name_every_diagnostic() -> None:
    for mode in diagnostics.DIAGNOSED_MODES:
        declared = {m for m in feedback_modes.MODES[mode].metrics if m.startswith("use/")}
        assert declared == {f"use/{d}/{mode}" for d in diagnostics.DIAGNOSTICS}, mode
