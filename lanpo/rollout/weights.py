"""Full weights on their way into an engine, on the driver's side: the names and shapes of the model the engine
serves (its checkpoint's safetensors headers), a state dict held to them, a saved folder snapshotted, and the
streamed transfer itself (`send_weights`).

Streamed: a state dict may hold FSDP2's DTensor shards (`lanpo.train.plumbing.fsdp`, the trainer's own
`model.state_dict()`). `checked_state` reads only their global names and shapes, so nothing is gathered to check
them; `gathered` then yields the tensors one at a time in name order, a shard all-gathered into its full tensor
(`DTensor.full_tensor()`, a collective: every rank streams the same names in the same order) and hashed on the
way, and `lanpo.rollout.vllm_worker.buckets` casts each to the engine's dtype and packs it before the next is
gathered. What a rank holds beyond its shards is one full tensor of the trainer's dtype and one bucket of the
engine's; the full fp32 state is never held anywhere. A plain (unsharded) state streams the same way, nothing
copied but the cast. The engine's worker still stages every bucket before it swaps (a failed transfer changes
nothing), in its own dtype, on the host: that is where a whole copy lives, 2 bytes a weight in bf16.

Imports no vLLM: the checks refuse weights of another model before anything is sent (`VLLMBackend.load_weights`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import ConfigError, InputError
from lanpo.models import model_folder
from lanpo.models.hashing import hash_tensor


def checkpoint_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a model folder's checkpoint, read from its safetensors headers (no tensor loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def checked_state(weights: Mapping[str, Any], expected: dict[str, tuple[int, ...]], model: Any) -> dict[str, Any]:
    """`weights` under the names of `model`'s checkpoint (`expected`: name -> shape), a tied copy left out (a
    tensor sharing the storage of one the checkpoint names, e.g. `lm_head.weight`, which a tied checkpoint does
    not hold); ConfigError naming other names, missing names and other shapes."""
    state: dict[str, Any] = {}
    unknown, wrong = [], []
    ptrs = {storage_ptr(t) for n, t in weights.items() if n in expected}
    for name, tensor in weights.items():
        if name not in expected:
            if storage_ptr(tensor) not in ptrs:
                unknown.append(name)
        elif tuple(tensor.shape) != expected[name]:
            wrong.append(f"{name} {tuple(tensor.shape)} (the model's: {expected[name]})")
        else:
            state[name] = tensor
    missing = sorted(set(expected) - set(state) - {w.split(" ")[0] for w in wrong})
    problems = [
        *(["not in the model: " + ", ".join(unknown[:3])] if unknown else []),
        *(["missing: " + ", ".join(missing[:3])] if missing else []),
        *(["other shapes: " + ", ".join(wrong[:3])] if wrong else []),
    ]
    if problems:
        raise ConfigError(
            f"these weights are not those of {model}, which the engine serves: " + "; ".join(problems),
            hint="load the state dict of the model the engine was started with (full fine-tuning of that model)",
        )
    return state


def storage_ptr(tensor: Any) -> int:
    """Where `tensor`'s bytes live, to find a tied copy: a DTensor shard's local storage (DTensor itself says 0),
    and for an empty tensor (a shard of nothing) a value no other tensor shares."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.data_ptr() if local.numel() else -id(tensor)


def gathered(state: Mapping[str, Any], digest: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of `state` one at a time, in name order: a DTensor shard all-gathered (a collective:
    every rank must stream the same state), a plain tensor as it is. Each is fed to `digest` on its way
    (`hash_tensor`), so that after the last `digest` is `state_sha256(state)`'s. The full tensor is dropped as
    soon as the consumer asks for the next one: hold on to it only as long as it takes to cast it."""
    from torch.distributed.tensor import DTensor

    for name in sorted(state):
        tensor = state[name]
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if digest is not None:
            hash_tensor(digest, name, full)
        yield name, full
        del full, tensor  # before the next gather: one full tensor at a time


def send_weights(
    state: Mapping[str, Any],
    rpc: Callable[..., Any],
    dtype: torch.dtype,
    limit_bytes: int,
    expected: Mapping[str, tuple[int, ...]],
    abort: Callable[[], None],
) -> tuple[str, Any]:
    """Stream `state` (checked: `checked_state`) into an engine's worker: `gathered`, cast to `dtype` and packed in
    buckets of about `limit_bytes` (`lanpo.rollout.vllm_worker.buckets`), each staged by `rpc("lanpo_stage", ...)`
    (the first carries `expected`, the checkpoint's names and shapes), then loaded whole by `rpc("lanpo_commit")`.
    Returns (the hash of `state`, `state_sha256`'s, computed on the way; what the commit returned). On any failure
    `abort()` drops what was staged, so the engine goes on serving the weights it had, and the error is raised."""
    from lanpo.rollout.vllm_worker import buckets

    digest = hashlib.sha256()
    first: dict[str, list[int]] | None = {k: list(v) for k, v in expected.items()}
    try:
        for bucket in buckets(gathered(state, digest), dtype, limit_bytes):
            rpc("lanpo_stage", bucket=bucket, expected=first)
            first = None  # the first bucket starts the transfer
        committed = rpc("lanpo_commit")
    except BaseException:
        abort()
        raise
    return digest.hexdigest(), committed


def weights_snapshot(weights: str | Path, root: Path) -> Path:
    """A private folder under `root` of the safetensors files the engine reloads from: hard links to a saved
    folder's files (a copy across file systems). The trainer may delete its folder afterwards."""
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".weights-"))
    try:
        source = model_folder(Path(weights).expanduser())
        files = sorted(source.glob("*.safetensors")) + sorted(source.glob("*.safetensors.index.json"))
        if not files:
            raise InputError(
                f"no model weights in {source} (*.safetensors)",
                hint="pass a folder written by save_pretrained, e.g. a checkpoint step-NNNNNN",
            )
        for file in files:
            try:
                os.link(file, staging / file.name)
            except OSError:
                shutil.copyfile(file, staging / file.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging
