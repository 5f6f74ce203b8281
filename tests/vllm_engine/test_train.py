"""`lanpo train` with `rollout.backend = "vllm"`: two GRPO steps on SmolLM2 through the engine (issue 9, section 2).

The trainer is wired to `VLLMBackend` in a separate change; its lane test goes here. What it should show: both
steps commit, each attempt's `served_adapter_sha256` equals the policy version that generated it (step 1: the
step-0 adapter, step 2: step 1's), and the engine's log-probs sit near the trainer's.
"""

from __future__ import annotations

import pytest

from tests.vllm_engine.helpers import needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]


@pytest.mark.skip(reason="the trainer is not wired to the vLLM backend yet (issue 9: the trainer-loop change)")
def test_two_train_steps_with_the_vllm_backend() -> None:
    raise AssertionError("to be written with the trainer's vLLM wiring")
