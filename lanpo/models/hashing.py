"""Weights hashes: which weights produced a row, the same function for a live model and a saved folder."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import InputError

ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what PEFT writes, newest format first


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The live adapter's tensors, named as PEFT saves them (`get_peft_model_state_dict`)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def read_adapter_state(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a saved PEFT adapter folder, by the names `adapter_state` gives them."""
    path = Path(adapter_dir)
    if not (path / "adapter_config.json").is_file():
        raise InputError(f"no PEFT adapter in {path} (adapter_config.json missing)")
    for name in ADAPTER_WEIGHTS:
        if (path / name).is_file():
            weights = path / name
            break
    else:
        raise InputError(f"no adapter weights in {path} (adapter_model.safetensors missing)")
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weights))
    return torch.load(weights, map_location="cpu", weights_only=True)


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """THE weights hash: names, shapes, dtypes and bytes of a state dict, in name order.

    Both `adapter_sha256` (a live model) and `adapter_dir_sha256` (a saved folder) are this function, so a served
    adapter's hash equals the trained policy's exactly when their weights are equal bit for bit. Under full
    fine-tuning a policy version is the hash of all its weights as its checkpoint saved them (`model_dir_sha256`).
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        hash_tensor(digest, name, tensor)
    return digest.hexdigest()


def hash_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """Feed one named tensor to `digest` as `state_sha256` does: tensors fed one by one in name order hash as the
    state dict they make (a streamed weight sync hashes each tensor as it passes, `lanpo.rollout.weights`)."""
    t = tensor.detach().to("cpu").contiguous()
    digest.update(name.encode())
    digest.update(str((tuple(t.shape), str(t.dtype))).encode())
    digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def adapter_sha256(model: Any) -> str:
    """The hash of a live PEFT model's adapter: which weights produced a row."""
    return state_sha256(adapter_state(model))


def adapter_dir_sha256(adapter_dir: str | Path) -> str:
    """The hash of a saved adapter folder; equal to `adapter_sha256` of the model that saved it."""
    return state_sha256(read_adapter_state(adapter_dir))


def read_model_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a saved model folder (every `*.safetensors` shard), named as saved: tied weights once."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise InputError(f"no model weights in {model_dir} (*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def model_dir_sha256(model_dir: str | Path) -> str:
    """The hash of a saved model folder's weights: a fully fine-tuned policy version, as trainer, inference and a
    vLLM engine that loaded the folder all see it."""
    return state_sha256(read_model_state(model_dir))
