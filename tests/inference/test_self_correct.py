"""Two-turn self-correction (paper 4.3): the first answer is the assistant's message, the reflection request the
user's next one, in the same chat. Attacked for leakage: no gold answer, reward or correctness reaches turn 2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lanpo import prompts
from lanpo.db.repo.problems import Question
from lanpo.inference.answerer import Answerer

from .conftest import ScriptedBackend, question_text

GOLD = "QZX-GOLD-7741"  # distinctive: found in no prompt, or the test fails


def scripted(make_answerer: Callable[..., Answerer]) -> tuple[Answerer, ScriptedBackend]:
    answerer = make_answerer()
    backend = ScriptedBackend(answerer.tokenizer)
    answerer.backend = backend
    return answerer, backend


def test_turn_two_continues_the_conversation(make_answerer: Callable[..., Answerer]) -> None:
    answerer, _ = scripted(make_answerer)
    (solution,) = answerer.solve([Question("a", question_text(2, 3, 0), "5")], "self-correct", 3)
    assert solution.mode == "self_correct"
    for sample in solution.samples:
        first, second = sample.turns
        assert (first.prompt_version, second.prompt_version) == (prompts.ACTOR_VERSION, prompts.REFLECT_VERSION)
        # turn 2's prompt is exactly: the zero-shot chat, the first answer as the assistant's turn, the request
        expected = [
            *prompts.actor_messages(question_text(2, 3, 0)),
            {"role": "assistant", "content": first.response.strip()},
            {"role": "user", "content": prompts.REFLECT},
        ]
        assert second.prompt == answerer.render(expected)
        assert second.prompt.startswith(first.prompt)  # the same conversation, continued
        answer_at, request_at = second.prompt.index(first.response.strip()), second.prompt.index(prompts.REFLECT)
        assert len(first.prompt) <= answer_at < request_at
        assert sample.final is second


def test_the_reflection_request_judges_nothing() -> None:
    lowered = prompts.REFLECT.lower()
    for word in prompts.JUDGEMENT_WORDS:
        assert word not in lowered, word


@pytest.mark.parametrize("mode", ["self_correct", "self_correct_single"])
def test_no_gold_reward_or_correctness_reaches_turn_two(make_answerer: Callable[..., Answerer], mode: str) -> None:
    """Attack: a distinctive gold answer is searched in every prompt the model saw; and turn 2's prompts are the
    same whether the first answers were graded right or wrong (so no grade can be in them)."""
    questions = [question_text(a, a + 1, q) for q, a in enumerate((2, 4, 6))]
    answerer, backend = scripted(make_answerer)
    solved = answerer.solve([Question(f"q{i}", text, GOLD) for i, text in enumerate(questions)], mode, 3)
    assert backend.prompts, "the scripted model saw no prompt"
    for prompt in backend.prompts:
        assert GOLD not in prompt
        for word in ("reward", "correct", "gold", "wrong"):
            assert word not in prompt.lower()
    for s in solved:
        for sample in s.samples:
            first = sample.turns[0]
            assert first.correct is False and first.reward is not None  # graded, and nothing of it went on
            assert str(first.reward) not in sample.turns[1].prompt.replace(first.response, "")

    def second_prompts(golds: list[str]) -> list[Any]:
        e, _ = scripted(make_answerer)
        out = e.solve(
            [Question(f"q{i}", t, g) for i, (t, g) in enumerate(zip(questions, golds, strict=True))], mode, 3
        )
        return [[sample.turns[1].prompt for sample in s.samples] for s in out], [
            [sample.turns[0].correct for sample in s.samples] for s in out
        ]

    right = [str(2 * a + 1) for a in (2, 4, 6)]  # the scripted model's exact sums
    wrong = [str(2 * a + 50) for a in (2, 4, 6)]
    prompts_right, graded_right = second_prompts(right)
    prompts_wrong, graded_wrong = second_prompts(wrong)
    assert any(any(g) for g in graded_right) and not any(any(g) for g in graded_wrong)  # the grades did differ
    assert prompts_right == prompts_wrong
