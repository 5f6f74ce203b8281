"""The yes/no relevance judge: the pure probability, answer tokens, batching, and the real SmolLM2 (slow)."""

from __future__ import annotations

import pytest
import torch

from lanpo.retrieval.judge import PROMPT_VERSION, answer_token_ids, yes_no_probability
from tests.retrieval.helpers import QUESTIONS, tiny_judge


def test_yes_no_probability_is_a_two_way_softmax_over_summed_spellings() -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, 20) * 4
    yes, no = [3, 7], [1, 11, 12]
    got = yes_no_probability(logits, yes, no)
    for row in range(5):
        p = torch.softmax(logits[row].double(), dim=-1)
        expected = p[yes].sum() / (p[yes].sum() + p[no].sum())
        assert got[row].item() == pytest.approx(expected.item(), rel=1e-5)
    assert ((got >= 0) & (got <= 1)).all()
    extreme = torch.zeros(2, 20)
    extreme[0, 3], extreme[1, 1] = 1e4, 1e4
    assert yes_no_probability(extreme, yes, no).tolist() == [1.0, 0.0]


def test_answer_tokens_are_disjoint_first_tokens() -> None:
    rater, _ = tiny_judge()
    yes, no = answer_token_ids(rater.tokenizer)
    assert not set(yes) & set(no)
    decoded = {rater.tokenizer.decode([t]) for t in yes} | {rater.tokenizer.decode([t]) for t in no}
    assert decoded == {"y", "Y", "n", "N"}  # char tokenizer: " yes" and " no" share " ", which is dropped


def test_scores_in_unit_interval_batched_equal_one_by_one() -> None:
    rater, seen = tiny_judge(batch_size=3)
    pairs = [(QUESTIONS[i], QUESTIONS[j] * (1 + j % 3)) for i in range(4) for j in range(4) if i != j]
    single = rater.score(pairs, batch_size=1, share_prefix=False)
    assert seen == [1] * 12
    seen.clear()
    batched = rater.score(pairs, share_prefix=False)
    assert seen == [3, 3, 3, 3]  # 12 pairs, 3 per forward
    seen.clear()
    shared = rater.score(pairs)  # default: one prefix pass per problem, then its 3 candidates in one batch
    assert seen == [3, 3, 3, 3] and rater.forward_calls == 12 + 4 + 8
    assert all(0.0 <= s <= 1.0 for s in batched)
    assert batched == pytest.approx(single, abs=1e-5)  # left padding changes nothing
    assert shared == pytest.approx(single, abs=1e-5)  # nor does the shared prefix cache
    assert len(set(batched)) > 1
    assert rater.identity == f"tiny|{PROMPT_VERSION}"


def test_prompt_holds_problem_then_feedback_in_the_chat_template() -> None:
    rater, _ = tiny_judge()
    prompt = rater.prompt("What is 2 + 2?", "Add the numbers.")
    assert prompt.index("What is 2 + 2?") < prompt.index("Feedback:\nAdd the numbers.") < prompt.rindex("yes or no")
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_scores_an_identical_problem_above_an_unrelated_one() -> None:
    from lanpo.retrieval.judge import load_judge

    rater = load_judge("smollm2", device="cpu", batch_size=4)
    problem = QUESTIONS[0]
    unrelated = "Write a short poem about autumn leaves falling in a quiet forest."
    same, other = rater.score([(problem, problem), (problem, unrelated)])
    assert 0.0 <= other < same <= 1.0
