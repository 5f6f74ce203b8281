"""What lanpo promises about seeded generation through vLLM, and only that (docs/reproducibility.md).

- `vllm.reproducible` (the CPU default): a seeded call returns what it returns on a FRESH engine of the same
  settings, whatever the calls before it left in the prefix cache. The reference is a second engine, started for
  this test: an engine that answered a repeat from its cache (a shorter prefill, other rounding) fails it.
- Without it (vLLM's defaults: engine core in a process of its own, prefix cache shared by calls): vLLM promises
  no repeat. What holds is the distribution: a repeat served from the prefix cache samples from the policy's own
  softmax(logits / T), within the engine's bf16 rounding of the trainer's fp32 log-probs, and not from another
  distribution (the T = 1 one sits 0.2 away). Whether its tokens repeat is printed, never asserted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from lanpo.rollout import SamplingParams
from tests.vllm_engine.helpers import ENGINE, chat, needs_vllm, trainer_logprobs

pytestmark = [pytest.mark.vllm, needs_vllm]

# Long prompts that share a prefix of several KV blocks, as a step's feedback prompts do: what the cache serves.
SHARED = "Earlier attempts, for reflection only. " + " ".join(f"Line {i}: {i} + {2 * i} = {3 * i}." for i in range(40))
QUESTIONS = tuple(f"{SHARED} Now: what is {a} + {b}?" for a, b in ((12, 30), (7, 35), (19, 23)))
PARAMS = SamplingParams(max_new_tokens=48, temperature=0.7, seed=5)


def _ids(groups: list[list[Any]]) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in g] for g in groups]


def test_a_reproducible_engine_answers_a_repeat_as_a_fresh_engine_does(backend: Any, smollm2_dir: Path) -> None:
    from lanpo.rollout.vllm import VLLMBackend

    assert backend.reproducible and backend.in_process  # the session engine's settings (helpers.ENGINE)
    prompts = chat(backend.tokenizer, QUESTIONS)
    first = backend.generate(prompts, 4, PARAMS)
    other = chat(backend.tokenizer, (f"{SHARED} Now: what is 5 + 6?",))
    backend.generate(other, 4, replace(PARAMS, seed=9))  # leaves the shared prefix's blocks behind
    again = backend.generate(prompts, 4, PARAMS)
    assert _ids(again) == _ids(first)
    with VLLMBackend(smollm2_dir, backend.tokenizer, ENGINE) as fresh:
        assert fresh.in_process
        assert _ids(fresh.generate(prompts, 4, PARAMS)) == _ids(first)


# The full lane (107 s of the vLLM lane on the slowest machine, nearly all of it the engine's start). Twin:
# tests/vllm_engine/test_generate.py::test_engine_logprobs_match_the_trainers, the same assertion on the session
# engine's log-probs at the sampling temperature; shown failing on the defect this test guards (the engine's raw
# log-probs, LOGPROBS_MODE = "raw_logprobs": mean |diff| 0.2365 at T 0.6 against the bound 0.06). An engine core
# in a process of its own with a prefix cache shared by requests stays in the lane:
# tests/vllm_engine/test_serve_engine.py.
@pytest.mark.full
@pytest.mark.long("an engine with vLLM's own defaults (its core in processes of its own), started for this test")
def test_without_the_switch_a_cached_repeat_samples_the_same_distribution(
    smollm2_dir: Path, hf_smollm2: tuple[Any, Any]
) -> None:
    from lanpo.rollout.vllm import VLLMBackend

    model, tokenizer = hf_smollm2
    params = replace(PARAMS, temperature=0.6)
    with VLLMBackend(smollm2_dir, tokenizer, replace(ENGINE, reproducible=False)) as engine:
        assert not engine.reproducible and not engine.in_process
        assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching  # repeats read the cache
        prompts = chat(tokenizer, QUESTIONS)
        calls = [engine.generate(prompts, 2, params) for _ in range(2)]  # the second from the prefix cache
    for groups in calls:
        completions = [c for g in groups for c in g]
        at_t = torch.cat([(torch.tensor(c.logprobs) - trainer_logprobs(model, c, 0.6)).abs() for c in completions])
        at_1 = torch.cat([(torch.tensor(c.logprobs) - trainer_logprobs(model, c)).abs() for c in completions])
        assert at_t.mean() < 0.06, at_t.mean()  # measured 0.03: bf16 against fp32
        assert at_1.mean() > 0.1, at_1.mean()  # the test tells one distribution from another
    same = sum(a == b for a, b in zip(_ids(calls[0]), _ids(calls[1]), strict=True))
    print(f"without reproducible: {same} of {len(QUESTIONS)} groups repeated their tokens")
