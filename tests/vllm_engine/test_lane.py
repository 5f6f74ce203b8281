"""The vllm lane's workers: pinned to their share of the cores (tests/conftest.py), each runs that many torch threads.

In the vllm venv torch is imported before `pytest_configure` pins the worker, its thread pool sized for every core:
two OpenMP threads then took turns on one core at every parallel region, and a LoRA test took 366 s beside the
other worker against 10.6 s once the pool was resized (docs/log.md). The main lane's workers import torch after the
hook and never had it, so this test lives here, where it can fail.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.vllm


def test_a_pinned_xdist_worker_runs_one_torch_thread_a_core() -> None:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        pytest.skip("only xdist workers are pinned (the lane runs -n 2)")
    import torch

    assert torch.get_num_threads() == len(os.sched_getaffinity(0))
