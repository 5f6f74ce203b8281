"""LoRA through the real engine: the served hash is the trained model's, snapshots, eviction, rank limits."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lanpo.errors import ConfigError
from lanpo.models import adapter_dir_sha256, load_adapter, load_causal_lm
from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import SavedAdapter, chat, needs_vllm, save_adapter, trainer_logprobs

pytestmark = [pytest.mark.vllm, needs_vllm]
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def test_the_served_adapter_is_the_trained_one(backend: Any, adapters: list[SavedAdapter], smollm2_dir: Path) -> None:
    prompts = chat(backend.tokenizer)
    plain = backend.generate(prompts, 1, GREEDY)
    v0 = adapters[0]
    assert adapter_dir_sha256(v0.path) == v0.sha256  # one hash: the saved folder's equals the live model's
    assert backend.set_adapter(v0.path) == v0.sha256 == backend.adapter_sha256
    assert backend.lora_load_seconds is not None
    adapted = backend.generate(prompts, 2, SamplingParams(max_new_tokens=24, temperature=1.0, seed=0))
    assert {c.served_adapter_sha256 for g in adapted for c in g} == {v0.sha256}
    greedy = backend.generate(prompts, 1, GREEDY)
    assert [g[0].token_ids for g in greedy] != [g[0].token_ids for g in plain]  # the adapter changed what was said
    # ... and it is the adapter PEFT applies: the engine's log-probs match the HF model carrying it
    base, _ = load_causal_lm(smollm2_dir, device="cpu", dtype="float32")
    peft_model = load_adapter(base, v0.path).eval()
    diffs = torch.cat([(torch.tensor(g[0].logprobs) - trainer_logprobs(peft_model, g[0])).abs() for g in greedy])
    assert diffs.mean() < 0.06, diffs.mean()
    backend.set_adapter(None)
    assert {c.served_adapter_sha256 for g in backend.generate(prompts, 1, GREEDY) for c in g} == {None}


def test_the_engine_serves_the_snapshot_taken_by_set_adapter(
    backend: Any, adapters: list[SavedAdapter], smollm2_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "policy"
    shutil.copytree(adapters[1].path, folder)
    assert backend.set_adapter(folder) == adapters[1].sha256
    rewritten = save_adapter(smollm2_dir, folder, seed=7)  # the trainer overwrites the folder in place
    (group,) = backend.generate(chat(backend.tokenizer)[:1], 1, GREEDY)
    assert group[0].served_adapter_sha256 == adapters[1].sha256  # still what was set, and it says so
    assert backend.set_adapter(folder) == rewritten.sha256 != adapters[1].sha256
    (group,) = backend.generate(chat(backend.tokenizer)[:1], 1, GREEDY)
    assert group[0].served_adapter_sha256 == rewritten.sha256


def test_at_most_max_loras_adapters_stay_loaded(backend: Any, adapters: list[SavedAdapter]) -> None:
    assert backend.config.max_loras == 2
    ids = []
    for adapter in [*adapters, adapters[0]]:  # the 4th set reloads v0 (evicted by v2) under a new id
        backend.set_adapter(adapter.path)
        backend.generate(chat(backend.tokenizer)[:1], 1, SamplingParams(max_new_tokens=2, temperature=0.0))
        ids.append(backend.loaded_adapters[adapter.sha256])
        loaded = backend.llm.llm_engine.list_loras()
        assert len(loaded) <= 2 and set(loaded) == set(backend.loaded_adapters.values())
    assert len(set(ids)) == 4  # an id is never reused: vLLM could answer from a stale cached copy
    assert list(backend.loaded_adapters) == [adapters[2].sha256, adapters[0].sha256]
    snapshots = [p for p in backend._snapshots.iterdir() if not p.name.startswith(".")]
    assert sorted(p.name for p in snapshots) == sorted(backend.loaded_adapters)


def test_a_rank_above_the_engines_limit_is_refused(backend: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    wide = save_adapter(smollm2_dir, tmp_path / "r32", seed=0, rank=32)
    with pytest.raises(ConfigError, match=r"LoRA rank 32, above vllm\.max_lora_rank = 16"):
        backend.set_adapter(wide.path)
    assert backend.adapter_sha256 is None and not [p for p in backend._snapshots.iterdir() if p.name.startswith(".")]
