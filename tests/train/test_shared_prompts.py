"""Shared-prompt forwards: each distinct prompt of a micro-batch runs once and its completions run on its cache
(`lanpo.train.forward.logprobs`), and n samples share a prompt's prefill in `generate` (`lanpo.rollout.hf`). Both must
give what running every row whole gives, and must actually share (counted forwards), on batches shaped as a training
step writes them: groups of n rows of one prompt, prompts of uneven length, completions ending at different
lengths, rows of a group not always next to each other."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lanpo.models import tiny_causal_lm
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend
from lanpo.train.config import LoraConfig, ModelConfig
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.forward.logprob_settings import LogprobSettings
from lanpo.train.forward.logprobs import completion_logprobs
from lanpo.train.policy import load_base, load_policy

PAD = 0


def _step_batch(prompt_lengths: tuple[int, ...] = (5, 17, 9, 30), n: int = 4, seed: int = 1) -> RolloutBatch:
    """len(prompt_lengths) groups x n rows, as `lanpo.train.loop` builds them: prompt ids repeated within a group,
    completions of 1..11 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for length in prompt_lengths:
        prompt = torch.randint(3, 60, (length,), generator=g).tolist()
        for _ in range(n):
            prompts.append(prompt)
            completions.append(torch.randint(3, 60, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g))
    return build_batch(prompts, [c.tolist() for c in completions], PAD, torch.device("cpu"))


class ForwardShapes:
    """The (rows, columns) of every forward the model runs."""

    def __init__(self, model: Any) -> None:
        self.shapes: list[tuple[int, int]] = []
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner.model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.shapes.append(tuple(ids.shape))


def _lora_model() -> Any:
    model, _ = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    with torch.no_grad():  # LoRA B off zero, so the adapter changes the forward and A gets a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    return model


@pytest.mark.parametrize(
    "rows",
    [
        slice(None),  # the whole step: 4 prompts x 4
        torch.tensor([15, 4, 5, 6, 7, 12, 13, 14]),  # a micro-batch whose groups are split and reordered
        torch.tensor([0, 1]),  # one prompt, the shortest: 25 columns of everyone else's padding dropped
    ],
    ids=["step", "reordered", "one-prompt"],
)
def test_shared_prompts_give_the_whole_rows_log_probs_entropy_and_gradient(rows: Any) -> None:
    model = _lora_model()
    batch = _step_batch().select(rows)
    results = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = completion_logprobs(model, batch, True, LogprobSettings(share_prompts=share))
        (logp * batch.completion_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), entropy, grads))
    (whole, whole_entropy, whole_grads), (shared, shared_entropy, shared_grads) = results
    mask = batch.completion_mask.bool()
    assert torch.allclose(shared[mask], whole[mask], atol=1e-5)
    assert torch.allclose(shared_entropy[mask], whole_entropy[mask], atol=1e-5)  # type: ignore[index]
    assert whole_grads.keys() == shared_grads.keys() and len(whole_grads) > 0
    for name, grad in whole_grads.items():
        assert torch.allclose(shared_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_each_distinct_prompt_runs_once_and_the_completions_on_its_cache() -> None:
    model = _lora_model()
    seen = ForwardShapes(model)
    batch = _step_batch()
    T = batch.completion_ids.shape[1]
    with torch.no_grad():
        completion_logprobs(model, batch)
    assert seen.shapes == [(4, 30), (16, T - 1)]  # 4 prompts once (the longest sets the width), then the 16 rows
    seen.shapes.clear()
    with torch.no_grad():
        completion_logprobs(model, batch, logprob_settings=LogprobSettings(share_prompts=False))
    assert seen.shapes == [(16, 30 + T)]


def test_rows_run_whole_when_nothing_is_shared_or_no_cache_is_kept() -> None:
    distinct = _step_batch(n=1)  # four prompts, one row each
    model = _lora_model()
    seen = ForwardShapes(model)
    with torch.no_grad():
        completion_logprobs(model, distinct)
    assert seen.shapes == [(4, distinct.input_ids.shape[1])]
    base, _ = load_base(ModelConfig(name="tiny-random", threads=1, gradient_checkpointing=True))
    seen = ForwardShapes(base)
    base.train()  # a checkpointed forward in training mode keeps no cache
    completion_logprobs(base, _step_batch())
    assert len(seen.shapes) == 1


def test_a_prompt_that_begins_with_the_pad_token_is_not_another_prompt_padded() -> None:
    """[pad, 7, 8] (three real tokens) and [7, 8] left-padded to three columns hold the same ids: the mask tells
    them apart, and each gets its own prefix."""
    model = _lora_model()
    batch = build_batch([[PAD, 7, 8], [PAD, 7, 8], [7, 8], [7, 8]], [[9, 10], [11], [9, 10], [12, 13]], PAD, "cpu")
    with torch.no_grad():
        shared, _ = completion_logprobs(model, batch)
        whole, _ = completion_logprobs(model, batch, logprob_settings=LogprobSettings(share_prompts=False))
    mask = batch.completion_mask.bool()
    assert torch.allclose(shared[mask], whole[mask], atol=1e-5)
    assert not torch.allclose(whole[0, :2], whole[2, :2])  # the two prompts do condition differently


def test_one_token_completions_need_only_the_prompt_forward() -> None:
    model = _lora_model()
    batch = build_batch([[5, 6, 7]] * 3 + [[8, 9]] * 3, [[10], [11], [12], [10], [13], [14]], PAD, "cpu")
    seen = ForwardShapes(model)
    with torch.no_grad():
        shared, _ = completion_logprobs(model, batch)
        whole, _ = completion_logprobs(model, batch, logprob_settings=LogprobSettings(share_prompts=False))
    assert seen.shapes == [(2, 3), (6, 4)]
    assert torch.allclose(shared, whole, atol=1e-5)


@pytest.mark.parametrize("max_new_tokens", [1, 12])
def test_n_samples_share_the_prefill_and_draw_what_num_return_sequences_draws(max_new_tokens: int) -> None:
    """The shared prefill against transformers' own `num_return_sequences = n`, at the same seed: the same rows in
    the same order take the same random numbers, so the same tokens (no row of the tiny model ends before the
    limit, so none leaves the batch early: tests/rollout/test_hf_decode.py covers that)."""
    model, tokenizer = tiny_causal_lm(seed=0)
    prompts = ["What is 2 + 3? Box the answer.", "hi", "Some context, then: what is 7 + 5?"]
    n, params = 4, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=3)
    want = HFBackend(model, tokenizer, reference=True).generate(prompts, n, params)
    seen = ForwardShapes(model)
    got = HFBackend(model, tokenizer).generate(prompts, n, params)
    assert [[c.token_ids for c in group] for group in got] == [[c.token_ids for c in group] for group in want]
    assert all(len(c.token_ids) > 0 for group in got for c in group) and len(got) == len(prompts)
    width = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert seen.shapes[:2] == [(3, width - 1), (12, 1)]  # each prompt's prefill once, then its last token n times
