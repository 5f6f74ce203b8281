"""Stop strings and an assistant prefill on the hf backend, against two references that can tell: the same greedy
decode without stop strings, cut where a stop string first appears (greedy decoding is a pure function of the
prefix, so the stopped run must be exactly that prefix), and transformers' `generate(stop_strings=...)`."""

from __future__ import annotations

import pytest

from lanpo.models import apply_chat, tiny_causal_lm
from lanpo.rollout import SamplingParams, cut_at_stop
from lanpo.rollout.hf import HFBackend

PROMPTS = ["What is 2 + 3? Box the answer.", "hi", "Some context, then: what is 7 + 5?"]


def test_cut_at_stop_takes_the_earliest_of_the_stop_strings() -> None:
    assert cut_at_stop("ab\n\ncd\n#e", ("\n#", "\n\n")) == ("ab", True)
    assert cut_at_stop("abc", ("x", "")) == ("abc", False)
    assert cut_at_stop("", ("a",)) == ("", False)


@pytest.mark.parametrize("reference", [False, True], ids=["decode-loop", "generate"])
def test_a_stopped_greedy_decode_is_the_unstopped_one_cut_at_the_first_stop(reference: bool) -> None:
    model, tokenizer = tiny_causal_lm(seed=0)
    backend = HFBackend(model, tokenizer, reference=reference)
    free = SamplingParams(max_new_tokens=40, temperature=0.0)
    full = [g[0] for g in backend.generate(PROMPTS, 1, free)]
    # a two-character stop string each row writes somewhere after its start: the rows stop at different places
    stops = tuple(dict.fromkeys(c.text[9:11] for c in full if len(c.text) > 12))
    assert len(stops) >= 2
    stopped = [g[0] for g in backend.generate(PROMPTS, 1, SamplingParams(40, 0.0, stop=stops))]
    hits = 0
    for whole, cut in zip(full, stopped, strict=True):
        expected, hit = cut_at_stop(whole.text, stops)
        hits += hit
        assert cut.text == expected
        if hit:
            assert cut.finish_reason == "stop"
            # the tokens run through the one that completed the stop string, and no further
            assert whole.token_ids[: len(cut.token_ids)] == cut.token_ids
            assert any(s in tokenizer.decode(cut.token_ids) for s in stops)
            assert not any(s in tokenizer.decode(cut.token_ids[:-1]) for s in stops)
        else:
            assert cut.token_ids == whole.token_ids
    assert hits >= 2


def test_a_prefill_is_continued_as_the_start_of_the_assistants_turn() -> None:
    model, tokenizer = tiny_causal_lm(seed=0)
    backend = HFBackend(model, tokenizer)
    messages = [{"role": "user", "content": "Say something."}]
    prefilled = apply_chat(tokenizer, messages, prefill="## Flow\n")
    assert prefilled == apply_chat(tokenizer, messages) + "## Flow\n"
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    # the prefill is prompt: a continuation of it is what the model writes after those tokens
    (continued,), (whole,) = (
        backend.generate([prefilled], 1, params),
        backend.generate([apply_chat(tokenizer, messages)], 1, params),
    )
    assert continued[0].prompt_token_ids[-len("## Flow\n") :] == tuple(
        tokenizer.encode("## Flow\n", add_special_tokens=False)
    )
    assert continued[0].prompt_token_ids != whole[0].prompt_token_ids
    with pytest.raises(ValueError, match="add_generation_prompt"):
        apply_chat(tokenizer, messages, add_generation_prompt=False, prefill="x")
