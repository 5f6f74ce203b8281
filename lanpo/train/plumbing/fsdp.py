"""FSDP2 (torch's `fully_shard`) for full fine-tuning under torchrun, and full state dicts for its checkpoints.

- `shard`: one FSDP unit per decoder layer (the classes in the model's `_no_split_modules`) and one for the rest
  (embeddings, final norm, head). Each rank keeps 1/W of every weight, gradient and optimizer state as DTensor
  shards; a unit's weights are all-gathered for its forward and backward and freed after. Gradients are
  reduce-scattered as averages, as DDP's all-reduce averages them, so the update scales losses the same way.
  `compute = bf16` (`grpo.autocast`): FSDP2 mixed precision, as verl's actor (`param_dtype` bf16, `reduce_dtype`
  fp32): the shards stay fp32 master weights, each unit is all-gathered as bf16 for its forward and backward (2
  bytes a weight, half the traffic) and freed after, and its bf16 gradients are reduce-scattered in fp32 into fp32
  gradient shards, where AdamW steps. Buffers (the rotary frequencies) stay fp32. The forwards run on weights that
  already are bf16, so the `torch.autocast` the update still wraps them in (verl's actor does too) casts no weight
  and caches none: no bf16 copy of the whole model exists on any rank, as it does under autocast alone.
- `full_weights`: while every rank generates on its own prompts with the hf backend (the policy's own model), the
  ranks run different numbers of forward passes (sequences stop at different lengths), which per-forward
  all-gathers cannot do. So the whole model is gathered once on every rank for the phase (the memory of one
  unsharded copy, 4 bytes a weight, as DDP holds all the time; 2 under mixed precision, which the hf backend then
  generates in), its forwards run without collectives, and the shards come back after. With an engine of its own
  (vLLM) nothing is gathered to generate (`lanpo.train.policy.FullPolicy.generating`).
- The weight sync into an engine takes no helper here: `model.state_dict()` of a sharded model holds DTensor
  shards, and `lanpo.rollout.weights.gathered` all-gathers them one tensor at a time on their way into the engine
  (cast to its dtype and freed before the next), so no rank holds the full state. `full_state_everywhere` is the
  whole gather at once, the sync's former path: the reference its tests and `bench/weight_sync.py` hold it to.
- `full_state` / `load_full_state` and the optimizer's: torch.distributed.checkpoint's state-dict API, keyed by
  parameter name. Rank 0 receives the full CPU tensors; loading takes the full state on every rank and each keeps
  its shard. The same calls work on an unsharded module, so a checkpoint loads at any world size.

Measured with gloo on CPU (torch 2.13): `fully_shard` runs there, and a sharded forward gives bit for bit the
logits of the unsharded model, so the frozen reference's KL is exactly 0 at step 1 at any world size. Under mixed
precision a sharded forward gives bit for bit the logits of the unsharded model with its parameters (not its
buffers) cast to bf16, autocast around it or not (tests/train/test_mixed_precision.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch


@functools.cache
def _state_dicts() -> ModuleType:
    """torch.distributed.checkpoint's state-dict helpers, imported on first use: they pull in DTensor and sympy,
    about a third of `import lanpo.train.loop` (1.5 of 4.5 s on a quiet 2-core machine), which every trainer, rank
    and worker process paid, sharded or not."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _gather() -> Any:
    """Full tensors on rank 0's CPU, none elsewhere."""
    return _state_dicts().StateDictOptions(full_state_dict=True, cpu_offload=True)


def _load() -> Any:
    """Every rank passes the full state; each keeps its shard."""
    return _state_dicts().StateDictOptions(full_state_dict=True)


def shard(model: Any, offload: bool = False, compute: torch.dtype | None = None) -> Any:
    """`model` sharded in place over the default process group (`offload`: shards live on the CPU; `compute`: the
    dtype its units are gathered and run in, gradients reduced in fp32; None: the shards' own, no cast)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy() if offload else OffloadPolicy()
    precision = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32 if compute else None)
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard by")
    for layer in layers:
        fully_shard(layer, reshard_after_forward=True, offload_policy=policy, mp_policy=precision)
    fully_shard(model, reshard_after_forward=True, offload_policy=policy, mp_policy=precision)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextmanager
def full_weights(model: Any) -> Iterator[None]:
    """Every rank holds all of a sharded `model`'s weights inside; its forwards then need no other rank."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()  # a collective: every rank enters together
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """Every weight by name, full and on the CPU, on rank 0 ({} on the others; every rank must call it)."""
    return _state_dicts().get_model_state_dict(model, options=_gather())


def full_state_everywhere(model: Any) -> dict[str, torch.Tensor]:
    """Every weight by name, full, on every rank (a plain model: its own state dict, nothing copied): 4 bytes a
    weight on every rank at once. Not the sync's path any more (that streams, `lanpo.rollout.weights.gathered`):
    the reference the streamed sync is tested and benched against."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return model.state_dict()
    return _state_dicts().get_model_state_dict(model, options=_load())


def load_full_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load full weights (tied ones may be given once) into `model`, sharded or not."""
    _state_dicts().set_model_state_dict(model, state, options=_load())


def full_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, full, on rank 0 ({} elsewhere; every rank calls it)."""
    return _state_dicts().get_optimizer_state_dict(model, optimizer, options=_gather())


def load_full_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    _state_dicts().set_optimizer_state_dict(model, optimizer, state, options=_load())
