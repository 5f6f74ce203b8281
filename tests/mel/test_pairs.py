"""MEL's pure pieces: contrastive pairs come only from mixed groups; the bifurcation heuristic on constructed
trajectories; the validation rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.mel.bifurcation import first_difference, normalise_step, shared_prefix, split_steps
from lanpo.mel.pairs import Pair, contrastive_pairs, group_pairs, is_mixed
from lanpo.mel.verdict import keeps, success_rate


def test_pairs_only_from_mixed_groups() -> None:
    correct = [[True, True], [False, False], [True, False, False], [False, True]]
    texts = [["a", "b"], ["c", "d"], ["e", "f", "g"], ["h", "i"]]
    pairs = contrastive_pairs([1, 2, 3, 4], correct, texts, per_problem=8)
    assert {p.group for p in pairs} == {2, 3}
    assert pairs == [Pair(2, 0, 1), Pair(2, 0, 2), Pair(3, 1, 0)]
    assert [is_mixed(c) for c in correct] == [False, False, True, True]


def test_diagonal_first_and_distinct_texts() -> None:
    # positives 0, 2 (and 4, a copy of 0's text); negatives 1, 3
    pairs = group_pairs([True, False, True, False, True], ["x", "y", "z", "w", " x "])
    assert pairs[:2] == [(0, 1), (2, 3)]  # the first min(|Y+|, |Y-|) pairs share no rollout
    assert sorted(pairs) == [(0, 1), (0, 3), (2, 1), (2, 3)]
    assert group_pairs([False, False], ["a", "b"]) == [] and group_pairs([True], ["a"]) == []


def test_caps_per_problem_and_per_step_round_robin() -> None:
    correct = [[True, False, False, True]] * 3
    texts = [["p", "n1", "n2", "q"]] * 3
    # problem 7 drawn twice in the step: its two groups share the per-problem cap
    pairs = contrastive_pairs([7, 8, 7], correct, texts, per_problem=3)
    assert sum(p.group in (0, 2) for p in pairs) == 3 and sum(p.group == 1 for p in pairs) == 3
    capped = contrastive_pairs([7, 8, 9], correct, texts, per_problem=3, total=4)
    assert [p.group for p in capped] == [0, 0, 1, 2]  # round-robin over problems, then sorted by group


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.booleans(), st.sampled_from("abcde")), min_size=2, max_size=6), max_size=6),
    st.integers(1, 5),
    st.integers(0, 7),
)
def test_every_pair_is_correct_against_incorrect_within_a_mixed_group(groups, per_problem, total) -> None:
    correct = [[c for c, _ in g] for g in groups]
    texts = [[t for _, t in g] for g in groups]
    pids = [i % 3 for i in range(len(groups))]
    pairs = contrastive_pairs(pids, correct, texts, per_problem, total)
    for p in pairs:
        assert is_mixed(correct[p.group])
        assert correct[p.group][p.positive] and not correct[p.group][p.negative]
    assert len(set(pairs)) == len(pairs)
    assert total == 0 or len(pairs) <= total
    for pid in set(pids):
        assert sum(pids[p.group] == pid for p in pairs) <= per_problem
    if total == 0:  # every mixed group contributes as long as its problem's cap allows
        for g, c in enumerate(correct):
            if is_mixed(c) and pids.index(pids[g]) == g:
                assert any(p.group == g for p in pairs)


# ----------------------------------------------------------------------------- steps and the bifurcation


POSITIVE = "We add the terms.\n3 + 4 = 7\n7 + 5 = 12\nSo the total is \\boxed{12}"
NEGATIVE = "we add the terms\n  3 + 4 = 7.\n7 + 5 = 13\nSo the total is \\boxed{13}"


def test_split_steps_by_lines_and_sentences() -> None:
    lines = split_steps(POSITIVE, "lines")
    assert lines == ["We add the terms.", "3 + 4 = 7", "7 + 5 = 12", "So the total is \\boxed{12}"]
    text = "First, 2.5 + 1 = 3.5. Then we double it!\n\nDone? Yes."
    assert split_steps(text, "sentences") == ["First, 2.5 + 1 = 3.5.", "Then we double it!", "Done?", "Yes."]
    assert split_steps("  \n\n", "lines") == []
    with pytest.raises(ValueError):
        split_steps("x", "paragraphs")


def test_normalisation_ignores_case_spacing_markers_and_trailing_punctuation() -> None:
    assert normalise_step("  3 +  4 = 7. ") == normalise_step("3 + 4 = 7")
    assert normalise_step("Step 2: Add them") == normalise_step("2. add them") == normalise_step("- add them")
    assert normalise_step("7 + 5 = 12") != normalise_step("7 + 5 = 13")


def test_first_difference_on_constructed_trajectories() -> None:
    positive, negative = split_steps(POSITIVE), split_steps(NEGATIVE)
    assert first_difference(positive, negative) == (3, 2)  # steps 1-2 shared (after normalisation), 3 goes astray
    assert first_difference(["a", "b", "c"], ["x", "b", "c"]) == (1, 0)  # astray from the first step
    assert first_difference(["a", "b", "c"], ["a", "b"]) == (2, 2)  # a shared prefix that stops: its last step
    assert first_difference(["a", "b"], ["a", "b", "c", "d"]) == (3, 2)  # runs on past the positive's end
    assert first_difference(["a"], ["a"]) == (1, 1)  # the same text: the negative's last step
    assert first_difference(["a"], []) == (1, 0)  # no step at all
    assert shared_prefix([], ["a"]) == 0


# ----------------------------------------------------------------------------- validation rules


@pytest.mark.parametrize(
    ("rule", "replays", "group_rate", "kept"),
    [
        ("beats_group", [True, True, False, False], 0.5, False),  # ties the group: no help, rejected
        ("beats_group", [True, True, True, False], 0.5, True),
        ("beats_group", [True, False, False, False], 0.25, False),
        ("beats_group", [True], 0.75, True),
        ("any_success", [False, False, True, False], 0.75, True),
        ("any_success", [False, False], 0.25, False),
    ],
)
def test_validation_rules(rule: str, replays: list[bool], group_rate: float, kept: bool) -> None:
    assert keeps(rule, replays, group_rate) is kept


def test_success_rate_and_unknown_rule() -> None:
    assert success_rate([True, False, True, True]) == 0.75 and success_rate([]) == 0.0
    with pytest.raises(ValueError, match="unknown validation rule"):
        keeps("majority", [True], 0.5)
