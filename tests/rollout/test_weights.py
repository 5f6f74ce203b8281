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
from lanpo.rollout.vllm_worker import pack, unpack
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
