"""Model loading helpers and the HF rollout backend, on tiny random models (and SmolLM2 when slow)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lanpo.errors import InputError
from lanpo.models import (
    LoraSpec,
    adapter_dir_sha256,
    adapter_sha256,
    apply_chat,
    attach_lora,
    load_adapter,
    load_causal_lm,
    merged_state,
    resolve_model,
    tiny_causal_lm,
)
from lanpo.rollout import SamplingParams, make_backend


def test_tiny_tokenizer_round_trips_chat() -> None:
    _, tok = tiny_causal_lm()
    text = apply_chat(tok, [{"role": "user", "content": "What is 2+3?"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok(text).input_ids) == text
    assert tok.padding_side == "left"


def test_hf_backend_groups_and_seeds() -> None:
    model, tok = tiny_causal_lm(seed=1)
    backend = make_backend("hf", model, tok, max_batch=4)
    prompts = [apply_chat(tok, [{"role": "user", "content": q}]) for q in ("1+1", "a much longer question here")]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    first = backend.generate(prompts, n=3, params=params)
    assert [len(g) for g in first] == [3, 3]
    for group, prompt in zip(first, prompts, strict=True):
        for c in group:
            assert tok.decode(c.prompt_token_ids) == prompt  # padding stripped
            assert len(c.token_ids) <= 12
            assert c.finish_reason in ("stop", "length")
            assert (c.finish_reason == "stop") == (c.token_ids[-1:] == (tok.eos_token_id,))
    again = backend.generate(prompts, n=3, params=params)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]


def test_greedy_returns_n_identical() -> None:
    model, tok = tiny_causal_lm(seed=2)
    backend = make_backend("hf", model, tok)
    (group,) = backend.generate([apply_chat(tok, [{"role": "user", "content": "hi"}])], 3, SamplingParams(8, 0.0))
    assert len({c.token_ids for c in group}) == 1 and len(group) == 3


def test_adapter_hash_changes_with_weights_and_survives_save(tmp_path: Path) -> None:
    model, _ = tiny_causal_lm()
    peft_model = attach_lora(model, LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    before = adapter_sha256(peft_model)
    with torch.no_grad():
        next(p for n, p in peft_model.named_parameters() if "lora_B" in n).add_(0.5)
    after = adapter_sha256(peft_model)
    assert before != after
    peft_model.save_pretrained(tmp_path / "adapter")
    reloaded = load_adapter(tiny_causal_lm()[0], tmp_path / "adapter")
    assert adapter_sha256(reloaded) == after


def test_one_adapter_hash_for_live_models_and_saved_folders(tmp_path: Path) -> None:
    """`adapter_sha256` (live) and `adapter_dir_sha256` (saved) are one function of the state dict: equal for the
    same weights in fp32 and bf16, different for other weights."""
    peft_model = attach_lora(tiny_causal_lm()[0], LoraSpec(rank=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.25)
    peft_model.save_pretrained(tmp_path / "fp32")
    assert adapter_dir_sha256(tmp_path / "fp32") == adapter_sha256(peft_model)
    peft_model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert adapter_dir_sha256(tmp_path / "bf16") == adapter_sha256(peft_model) != adapter_dir_sha256(tmp_path / "fp32")
    with pytest.raises(InputError, match=r"adapter_config\.json missing"):
        adapter_dir_sha256(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(InputError, match="no adapter weights"):
        adapter_dir_sha256(tmp_path)


def test_hf_completions_carry_the_served_adapter_hash() -> None:
    model, tok = tiny_causal_lm(seed=3)
    prompt = apply_chat(tok, [{"role": "user", "content": "hi"}])
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    (plain,) = make_backend("hf", model, tok).generate([prompt], 2, greedy)
    assert [c.served_adapter_sha256 for c in plain] == [None, None] and plain[0].logprobs is None
    peft_model = attach_lora(model, LoraSpec(rank=2, alpha=4, target_modules=["q_proj"]))
    backend = make_backend("hf", peft_model, tok)
    (adapted,) = backend.generate([prompt], 2, greedy)
    assert {c.served_adapter_sha256 for c in adapted} == {adapter_sha256(peft_model)}
    with peft_model.disable_adapter():  # the reference policy: the base weights serve
        (reference,) = backend.generate([prompt], 1, greedy)
    assert reference[0].served_adapter_sha256 is None


def test_hf_min_new_tokens_gives_equal_lengths() -> None:
    model, tok = tiny_causal_lm(seed=4)
    prompts = [apply_chat(tok, [{"role": "user", "content": q}]) for q in ("a", "bb")]
    groups = make_backend("hf", model, tok).generate(prompts, 2, SamplingParams(6, 1.0, seed=0, min_new_tokens=6))
    assert {len(c.token_ids) for g in groups for c in g} == {6}


def test_bad_model_paths_are_clear(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        resolve_model("./no/such/folder")
    with pytest.raises(InputError, match="not a Hugging Face model folder"):
        resolve_model(tmp_path)
    with pytest.raises(InputError, match="no PEFT adapter"):
        load_adapter(tiny_causal_lm()[0], tmp_path)


def test_unknown_backend() -> None:
    from lanpo.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown rollout backend"):
        make_backend("tgi", None, None)


@pytest.mark.slow
def test_smollm2_loads_offline_and_answers() -> None:
    model, tok = load_causal_lm("smollm2")
    backend = make_backend("hf", model, tok)
    prompt = apply_chat(tok, [{"role": "user", "content": "What is 2+3? Answer with a number."}])
    (group,) = backend.generate([prompt], 1, SamplingParams(max_new_tokens=16, temperature=0.0))
    assert "5" in group[0].text


def test_merged_state_is_the_model_peft_merges_and_leaves_the_model_as_it_was() -> None:
    """`merged_state` against PEFT's own `merge_and_unload` of a copy (the reference): the same names (the base
    model's, tied weights tied) and values to fp32 rounding, and a plain model loaded with it computes what the
    adapted one does. The adapted model itself is untouched, bit for bit."""
    base, _ = tiny_causal_lm(seed=5)
    model = attach_lora(base, LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {k: v.clone() for k, v in model.get_base_model().state_dict().items()}
    merged = merged_state(model)
    reference = copy.deepcopy(model).merge_and_unload()
    expected = reference.state_dict()
    assert sorted(merged) == sorted(expected)
    for name, tensor in expected.items():  # PEFT adds the same delta to the same weight: the same bits
        assert torch.equal(merged[name], tensor), name
    adapted = [n for n in merged if n.endswith(("q_proj.weight", "v_proj.weight", "up_proj.weight"))]
    assert adapted and all(
        not torch.equal(merged[n], before[n.replace(".weight", ".base_layer.weight")]) for n in adapted
    )
    untouched = [n for n in merged if n not in adapted]
    assert all(torch.equal(merged[n], before[n]) for n in untouched if n in before)
    assert all(torch.equal(before[k], v) for k, v in model.get_base_model().state_dict().items())
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    plain = copy.deepcopy(reference)
    plain.load_state_dict(merged)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
