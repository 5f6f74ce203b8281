"""lanpo's decode loop (`lanpo.rollout.hf`): rows leave the batch as they finish, and what is left must decode as
if nothing had left. Checked on a tiny model that ends rows at different steps (a stop rule on the token fed in),
against transformers' `generate` (greedy: the same tokens) and against each row's own teacher-forced forward
(sampled: the logits every draw was made from)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import lanpo.rollout.hf as hf
from lanpo.models import tiny_causal_lm
from lanpo.rollout import SamplingParams
from lanpo.rollout.hf import HFBackend

PROMPTS = ["What is 2 + 3? Box the answer.", "hi", "Some context, then: what is 7 + 5?", "12 + 30 = ?", "a b c"]


def stopping_model(every: int = 7, push: float = 20.0) -> tuple[Any, Any]:
    """The tiny random model, with EOS pushed up after a token whose id plus position is a multiple of `every`:
    rows end at different steps, greedy or sampled (a random tiny model alone never emits EOS)."""
    model, tokenizer = tiny_causal_lm(seed=0)
    eos, fed = tokenizer.eos_token_id, {}

    def remember(_module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("position_ids")
        fed["key"] = ids + (positions if positions is not None else torch.arange(ids.shape[1]))

    def push_eos(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        key = fed["key"][:, -logits.shape[1] :]  # of the tokens whose next-token logits these are
        return logits + (key % every == 0).unsqueeze(-1) * push * torch.nn.functional.one_hot(
            torch.tensor(eos), logits.shape[-1]
        )

    model.register_forward_pre_hook(remember, with_kwargs=True)
    model.lm_head.register_forward_hook(push_eos)
    return model, tokenizer


def rows_per_forward(model: Any) -> list[int]:
    seen: list[int] = []
    model.model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    return seen


def test_greedy_rows_that_finish_leave_and_the_rest_decode_what_generate_decodes() -> None:
    model, tokenizer = stopping_model(every=11)
    params = SamplingParams(temperature=0, max_new_tokens=10)
    want = HFBackend(model, tokenizer, reference=True).generate(PROMPTS, 1, params)
    seen = rows_per_forward(model)
    got = HFBackend(model, tokenizer).generate(PROMPTS, 1, params)
    assert [g[0].token_ids for g in got] == [w[0].token_ids for w in want]
    lengths = [len(g[0].token_ids) for g in got]
    assert len(set(lengths)) >= 3 and max(lengths) == 10  # rows did end at different steps, one ran to the limit
    assert [g[0].finish_reason for g in got] == [w[0].finish_reason for w in want]
    assert {g[0].finish_reason for g in got} == {"stop", "length"}
    # one prefill, then each forward holds exactly the rows that had not finished
    assert seen[1:] == [sum(n > step for n in lengths) for step in range(max(lengths))]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_rows_draw_from_their_own_logits_after_others_leave(
    monkeypatch: pytest.MonkeyPatch, temperature: float, top_p: float
) -> None:
    """Every draw of every row, before and after rows left the batch, was made from that row's own next-token
    logits: those a full forward of its prompt and the tokens it had so far gives."""
    model, tokenizer = stopping_model()
    drawn: list[torch.Tensor] = []  # per step: the scores of the rows still in the batch, in row order
    warpers = hf._warpers

    def recording(params: SamplingParams, greedy: bool) -> Any:
        inner = warpers(params, greedy)
        return lambda ids, scores: inner(ids, drawn.append(scores.clone()) or scores)

    monkeypatch.setattr(hf, "_warpers", recording)
    n = 4
    groups = HFBackend(model, tokenizer).generate(
        PROMPTS, n, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=5)
    )
    rows = [c for group in groups for c in group]
    lengths = [len(c.token_ids) for c in rows]
    assert min(lengths) < 6 and max(lengths) == 12 and len(drawn) == 12  # rows left early; one ran to the end
    for step, scores in enumerate(drawn):
        alive = [c for c in rows if len(c.token_ids) > step]
        assert scores.shape[0] == len(alive)
        with torch.no_grad():
            own = torch.stack(
                [model(input_ids=torch.tensor([c.prompt_token_ids + c.token_ids[:step]])).logits[0, -1] for c in alive]
            )
        assert torch.allclose(scores, own, atol=1e-5), step


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.6, 0.9)])
def test_while_no_row_finishes_the_draws_are_generates_draws(temperature: float, top_p: float) -> None:
    """Until a row leaves, the loop draws what `generate` draws at the same seed: the same tokens, with the
    warpers (temperature, top-p) in `generate`'s order."""
    model, tokenizer = stopping_model(every=10_000)  # the stop rule off: only the limit ends rows
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=10, min_new_tokens=10, seed=11)
    want = HFBackend(model, tokenizer, reference=True).generate(PROMPTS, 3, params)
    got = HFBackend(model, tokenizer).generate(PROMPTS, 3, params)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in want]
    assert len({c.token_ids for g in got for c in g}) > 1


def test_min_new_tokens_holds_eos_back() -> None:
    model, tokenizer = stopping_model()
    free = HFBackend(model, tokenizer).generate(PROMPTS, 2, SamplingParams(max_new_tokens=12, seed=2))
    held = HFBackend(model, tokenizer).generate(
        PROMPTS, 2, SamplingParams(max_new_tokens=12, min_new_tokens=6, seed=2)
    )
    assert min(len(c.token_ids) for g in free for c in g) < 6
    assert all(len(c.token_ids) >= 6 for g in held for c in g)
    assert all(tokenizer.eos_token_id not in c.token_ids[:-1] for g in held for c in g)


def test_greedy_gives_n_identical_completions_and_zero_tokens_gives_empty_ones() -> None:
    model, tokenizer = stopping_model()
    groups = HFBackend(model, tokenizer).generate(PROMPTS[:2], 3, SamplingParams(temperature=0, max_new_tokens=8))
    assert all(len({c.token_ids for c in g}) == 1 and len(g) == 3 for g in groups)
    empty = HFBackend(model, tokenizer).generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=0))
    assert [[c.token_ids for c in g] for g in empty] == [[(), ()], [(), ()]]


def test_a_seeded_call_repeats_exactly_and_another_seed_does_not() -> None:
    """The hf backend's promise (docs/reproducibility.md): a seeded call repeats token for token in the same
    process, rows leaving at different steps included, whatever ran in between; another seed draws otherwise."""
    model, tokenizer = stopping_model()
    backend = HFBackend(model, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)
    first = [[c.token_ids for c in g] for g in backend.generate(PROMPTS, 4, params)]
    backend.generate(PROMPTS[:2], 3, SamplingParams(temperature=0.7, max_new_tokens=9, seed=6))  # in between
    assert [[c.token_ids for c in g] for g in backend.generate(PROMPTS, 4, params)] == first
    assert len({len(t) for g in first for t in g}) > 1  # rows did leave at different steps
    other = [[c.token_ids for c in g] for g in backend.generate(PROMPTS, 4, replace(params, seed=6))]
    assert other != first
