"""On a CUDA machine the lane's engine runs on the GPU with the GPU defaults (skipped elsewhere)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import SavedAdapter, chat, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.gpu, needs_vllm]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and the CUDA build of vLLM ('.[vllm]')")
def test_the_engine_runs_on_the_gpu_with_its_defaults(backend: Any, adapters: list[SavedAdapter]) -> None:
    from vllm.platforms import current_platform

    assert current_platform.device_type == "cuda"
    config = backend.llm.llm_engine.vllm_config
    assert config.cache_config.gpu_memory_utilization == 0.45 and not config.model_config.enforce_eager
    backend.set_adapter(adapters[0].path)
    groups = backend.generate(chat(backend.tokenizer), 4, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0))
    assert {c.served_adapter_sha256 for g in groups for c in g} == {adapters[0].sha256}
