"""Full fine-tuning under FSDP2 beside an engine of its own (issue 37 (b), (c)), on 2 gloo ranks.

- Generation: with an engine that has weights of its own, no phase around generation (generate, summarize, MEL's
  diagnoses and replays, validation) all-gathers any of the sharded policy, and the tokens are those of one
  unsharded process; the hf backend, which generates with the policy's own model, still gathers it (the counter
  can fail) and generates the same tokens.
- The sync streams: what the engine's worker receives is, byte for byte, the bf16 cast of the whole fp32 state
  (`fsdp.full_state_everywhere`, the former path) and of a single process's weights, under the checkpoint's hash;
  at most one gathered tensor is alive at any moment, and a bucket holds less than the limit plus one tensor. A
  bucket lost half-way reaches no model and leaves nothing staged (the real engine's twin:
  tests/vllm_engine/test_full_weights.py::test_a_transfer_that_fails_half_way_leaves_the_previous_weights_served_whole).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from lanpo.models import model_dir_sha256
from lanpo.rollout.hf import HFBackend
from tests.train import fsdp_engine_workers as w


def _received_bytes(result: dict[str, Any]) -> dict[str, bytes]:
    return {name: t.view(torch.uint8).numpy().tobytes() for name, t in result["received"].items()}


def test_an_engine_generates_without_gathering_the_policy_and_the_sync_streams(tmp_path: Path) -> None:
    model, tokenizer = w.start()
    folder = tmp_path / "start"
    model.save_pretrained(folder)  # the checkpoint the engine serves: its names and shapes (tied head once)
    out = tmp_path / "ranks.pt"
    mp.start_processes(
        w.worker, args=(2, str(tmp_path / "store"), str(folder), str(out)), nprocs=2, start_method="spawn", join=True
    )
    got = torch.load(out, weights_only=False)
    rank0, ranks = got["rank0"], got["ranks"]

    # the single process: the same weights, unsharded, generating each rank's prompts and syncing
    single = HFBackend(model.eval(), tokenizer)
    for rank, theirs in enumerate(ranks):
        expected = w.tokens(single.generate(w.prompts(rank), 2, w.PARAMS))
        assert all(theirs["engine_tokens"][name] == expected for name in (*w.PHASES, "validate")), rank
        assert theirs["hf_tokens"] == expected, rank  # the policy itself, gathered for the phase, samples the same
    assert rank0["engine_generates"] and not rank0["hf_engine_generates"]
    assert rank0["gathers_with_engine"] == 0  # not one unit of the policy gathered while the engine generated
    assert rank0["gathers_with_hf"] >= 3  # the hf backend: every unit (2 layers and the root), once for the phase
    assert rank0["sharded_after"]

    alone = w.sync(model.state_dict(), folder)
    streamed, whole = rank0["streamed"], rank0["whole"]
    assert streamed["sha"] == whole["sha"] == alone["sha"] == model_dir_sha256(folder)
    assert _received_bytes(streamed) == _received_bytes(whole) == _received_bytes(alone)
    assert rank0["whole_tied_copy"]  # the former path's full gather untied the head (its sync refused it)
    assert _received_bytes(ranks[1]["streamed"]) == _received_bytes(streamed)  # every rank's engine: the same
    assert all(t.dtype == torch.bfloat16 for t in streamed["received"].values()) and streamed["reloads"] == 1
    state = dict(model.state_dict())
    state.pop("lm_head.weight")  # tied: the checkpoint holds it once
    assert set(streamed["received"]) == set(state)
    for name, t in state.items():
        assert torch.equal(streamed["received"][name], t.to(torch.bfloat16)), name

    live = rank0["live"]
    assert live["gathers"] == len(state)  # one tensor a gather
    assert live["peak"] == live["largest"]  # never two gathered tensors alive at once
    assert live["peak"] * 6 < rank0["whole_bytes"]  # the former path held all of them at once
    largest_bf16 = max(t.numel() * 2 for t in state.values())
    assert len(streamed["buckets"]) > 3 and max(streamed["buckets"]) < w.LIMIT + largest_bf16

    failed = rank0["failed"]
    assert "lost on the way" in failed["error"] and failed["reloads"] == 0 and failed["received"] == {}
    assert failed["still_staged"] is None  # dropped whole: the engine serves the weights it had
    assert _received_bytes(rank0["after_failure"]) == _received_bytes(streamed)  # and the next one goes through
