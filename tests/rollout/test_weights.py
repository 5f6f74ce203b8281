"""The driver's side of a full-weight sync (`lanpo.rollout.weights`), without an engine: a state dict is held to the
names and shapes of the checkpoint the engine serves, tied copies once, and weights of another model are refused
naming what is wrong. The engine's side runs in the vLLM lane (tests/vllm_engine/test_full_weights.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lanpo.errors import ConfigError, InputError
from lanpo.models import model_dir_sha256, state_sha256, tiny_causal_lm
from lanpo.rollout.vllm_worker import LanpoWorker, buckets, pack, unpack
from lanpo.rollout.weights import checked_state, checkpoint_shapes, weights_snapshot


@pytest.fixture
def saved(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    model, _ = tiny_causal_lm(seed=7)
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def test_a_state_dict_is_held_to_the_checkpoints_names_tied_weights_once(saved: tuple[torch.nn.Module, Path]) -> None:
    model, folder = saved
    expected = checkpoint_shapes(folder)
    state = model.state_dict()
    assert model.config.tie_word_embeddings and "lm_head.weight" in state and "lm_head.weight" not in expected
    kept = checked_state(state, expected, folder)
    assert sorted(kept) == sorted(expected)
    assert state_sha256(kept) == model_dir_sha256(folder)  # the hash a checkpoint of the same weights has


def test_weights_of_another_model_are_refused_naming_what_is_wrong(saved: tuple[torch.nn.Module, Path]) -> None:
    model, folder = saved
    expected = checkpoint_shapes(folder)
    state = dict(model.state_dict())
    with pytest.raises(ConfigError, match=r"not in the model: extra\.weight") as info:
        checked_state({**state, "extra.weight": torch.zeros(2)}, expected, folder)
    assert info.value.hint
    name = next(iter(expected))
    with pytest.raises(ConfigError, match=rf"missing: {name}"):
        checked_state({k: v for k, v in state.items() if k != name}, expected, folder)
    with pytest.raises(ConfigError, match=rf"other shapes: {name} \(3,\)"):
        checked_state({**state, name: torch.zeros(3)}, expected, folder)
    untied = copy.deepcopy(state)
    untied["lm_head.weight"] = untied["lm_head.weight"].clone()  # a head of its own: not this tied model's
    with pytest.raises(ConfigError, match=r"not in the model: lm_head\.weight"):
        checked_state(untied, expected, folder)


def test_tensors_travel_bit_for_bit_in_every_dtype() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = (torch.randn(3, 5) * 100).to(dtype)
        name, back = unpack(pack("w", t))
        assert name == "w" and back.dtype == dtype and torch.equal(back, t)
    assert unpack(pack("e", torch.empty(0, 4)))[1].shape == (0, 4)


def test_a_snapshot_links_a_checkpoints_files_and_refuses_a_folder_without_weights(
    saved: tuple[torch.nn.Module, Path], tmp_path: Path
) -> None:
    _, folder = saved
    root = tmp_path / "snapshots"
    root.mkdir()
    snap = weights_snapshot(folder, root)
    assert model_dir_sha256(snap) == model_dir_sha256(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no model weights"):
        weights_snapshot(tmp_path / "empty", root)
    assert [p.name for p in root.iterdir()] == [snap.name]  # the failed one left nothing behind


def _sizes(bucket: list) -> list[int]:
    return [len(raw) for _name, _dtype, _shape, raw in bucket]


def test_buckets_are_bounded_in_order_and_bit_for_bit_in_the_engines_dtype() -> None:
    """A bucket closes at the first tensor that takes it to the limit, so every bucket but the last holds at least
    `limit` bytes and less than `limit` before its last tensor (a tensor above the limit closes its bucket)."""
    generator = torch.Generator().manual_seed(0)
    sizes = [3, 700, 40, 40, 40, 5000, 1, 260, 260]  # elements; bf16: 2 bytes each
    state = {f"w{i}": torch.randn(n, generator=generator) for i, n in enumerate(sizes)}
    limit = 1000
    sent = list(buckets(state, torch.bfloat16, limit))
    assert [unpack(item)[0] for bucket in sent for item in bucket] == list(state)  # every name, in order, once
    for bucket in sent[:-1]:
        assert sum(_sizes(bucket)) >= limit and sum(_sizes(bucket)[:-1]) < limit
    assert sum(_sizes(sent[-1])) > 0 and sum(_sizes(sent[-1])[:-1]) < limit
    assert [[item[0] for item in b] for b in sent] == [["w0", "w1"], ["w2", "w3", "w4", "w5"], ["w6", "w7", "w8"]]
    for bucket in sent:
        for item in bucket:
            name, tensor = unpack(item)
            assert tensor.dtype is torch.bfloat16 and torch.equal(tensor, state[name].to(torch.bfloat16))
    assert list(buckets({}, torch.bfloat16, limit)) == [[]]  # an empty transfer still starts one


def test_the_worker_loads_nothing_until_every_weight_arrived() -> None:
    """`LanpoWorker` (vLLM's worker half, used here without vLLM: nothing reaches a model) stages buckets, refuses
    a name or shape the model does not have by dropping the whole transfer, and refuses to commit a transfer with a
    bucket missing."""
    state = {"a": torch.ones(4), "b": torch.zeros(2, 3), "c": torch.full((5,), 2.0)}
    expected = {k: list(v.shape) for k, v in state.items()}
    sent = list(buckets(state, torch.bfloat16, 8))
    assert len(sent) == 3
    worker = LanpoWorker()
    with pytest.raises(RuntimeError, match="without a transfer"):
        worker.lanpo_stage(sent[1])
    assert worker.lanpo_stage(sent[0], expected=expected) == 1
    assert worker.lanpo_stage(sent[1]) == 2
    with pytest.raises(ValueError, match=r"1 weights never arrived, e\.g\. \['c'\]: nothing was loaded"):
        worker.lanpo_commit()
    worker.lanpo_stage(sent[0], expected=expected)
    with pytest.raises(ValueError, match=r"weight b of shape \(3, 2\) is not the model's"):
        worker.lanpo_stage([pack("b", torch.zeros(3, 2))])
    with pytest.raises(RuntimeError, match="without a transfer"):  # the refused transfer was dropped whole
        worker.lanpo_stage(sent[2])
