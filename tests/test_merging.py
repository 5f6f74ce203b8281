"""The merge's guard and its choice of text (lanpo.merging), on the texts a lesson holds."""

from __future__ import annotations

import pytest

from lanpo.merging import keeps_new, same_terms, same_text, terms


def test_terms_are_the_numbers_and_the_operations_a_text_names() -> None:
    assert terms("Add 3 to 4.0, then subtract the product; never divide.") == frozenset(
        {"3", "4", "add", "subtract", "multiply", "negation", "divide"}
    )
    assert terms("-2 and 2.50") == frozenset({"-2", "2.5"})
    assert terms("nothing to see") == frozenset()


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Add the tens first.", "First, sum up the tens.", True),  # a paraphrase: the same concept
        ("Add the tens first.", "Subtract the tens first.", False),  # an operation swapped
        ("Carry the 1 into the tens.", "Carry the 2 into the tens.", False),  # a number changed
        ("Check the sign.", "Do not check the sign.", False),  # a negation added
        ("Keep 3.0 in mind.", "Keep 3 in mind.", True),  # the same number written two ways
    ],
)
def test_same_terms_refuses_a_changed_number_operation_or_negation(a: str, b: str, same: bool) -> None:
    assert same_terms(a, b) is same


def test_same_text_ignores_case_and_whitespace_only() -> None:
    assert same_text("## Flow\n  Add it", "## flow add   it\n")
    assert not same_text("Add it.", "Add it")


@pytest.mark.parametrize(
    ("keeps", "new", "current", "expected"),
    [
        ("newer", 0.0, 1.0, True),
        ("newer", None, 1.0, True),
        ("higher_reward", 1.1, 1.0, True),
        ("higher_reward", 1.0, 1.0, False),  # a tie keeps the current text
        ("higher_reward", 0.5, 1.0, False),
        ("higher_reward", 0.5, None, True),  # a missing reward counts lowest
        ("higher_reward", None, None, False),
    ],
)
def test_keeps_new(keeps: str, new: float | None, current: float | None, expected: bool) -> None:
    assert keeps_new(keeps, new, current) is expected


def test_keeps_new_refuses_an_unknown_setting() -> None:
    with pytest.raises(ValueError, match="merge_keeps"):
        keeps_new("longest", 1.0, 0.0)
