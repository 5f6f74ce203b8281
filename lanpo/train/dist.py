"""Data parallelism for the trainer under torchrun / accelerate: one process per GPU (or CPU, with gloo).

Each rank takes its share of the step's problems, reads its own feedback contexts, generates and grades its
rollouts; the update averages LoRA gradients with an all-reduce (what DDP does, without its bucketing: the
adapter is small) and normalises the token-mean loss by the token count over all ranks. Rank 0 alone writes
the checkpoint and the step's one transaction, from rows gathered from every rank; a barrier after the commit
keeps the next step's context reads behind it. A single process (no WORLD_SIZE) skips all of this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (a no-op for one process)."""
        if self.enabled:
            torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of `params` over ranks (each rank's loss is already scaled by global counts)."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch_dist.all_reduce(flat, op=torch_dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (in rank order); None elsewhere."""
        if not self.enabled:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.is_main else None
        torch_dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]


def init_from_env() -> Dist:
    """Join the process group torchrun / accelerate describe in the environment (or run alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch_dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        torch_dist.init_process_group(backend=backend)
    return Dist(rank=rank, world=world, local_rank=local_rank)
