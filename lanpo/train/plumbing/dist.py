"""Data parallelism under torchrun / accelerate: one process per GPU (or per CPU worker, with gloo).

- Each rank takes its share of the step's prompts, strided (rank r: prompts r, r + W, r + 2W, ...), reads its own
  feedback contexts, generates and grades its rollouts.
- A LoRA update runs through torch's DistributedDataParallel (`wrap`): DDP all-reduces the trainable parameters'
  gradients in buckets during backward. Full fine-tuning shards the model with FSDP2 instead
  (`lanpo.train.plumbing.fsdp`). Sizes are global (a minibatch counts sequences over all ranks), so every rank holds
  the same share of each minibatch and the minibatches are the single process's ones: with the strided assignment, rank
  r's j-th local block of prompts, taken over every r, is exactly block j of the whole batch.
- Rank 0 alone writes the checkpoint (every rank sends it its FSDP shards) and the step's one transaction, from
  what every rank sends it (`gather_step`); a barrier after the commit keeps the next step's context reads behind it.
- Every collective gives up after $LANPO_DIST_TIMEOUT seconds (default 3600), so a rank that died or stalls (in
  SFT's broadcast, say) fails the job instead of leaving the others blocked for ever.

A single process (no WORLD_SIZE) skips all of this. `Dist(joined=True)` in a one-rank process group runs it at world
size 1 (bench/gpu_check.py: FSDP2 on one GPU).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist

from lanpo.errors import ConfigError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    joined: bool = False  # in a process group even alone: world 1 runs the collective paths (FSDP2, DDP) too

    @property
    def enabled(self) -> bool:
        return self.world > 1 or self.joined

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[Any]) -> list[Any]:
        """This rank's share of a step's prompts: items r, r + W, r + 2W, ..."""
        return list(items[self.rank :: self.world])

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (a no-op for one process)."""
        if self.enabled:
            torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Maximum over ranks, in place (a no-op for one process)."""
        if self.enabled:
            torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
        return tensor

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (in rank order); None elsewhere."""
        if not self.enabled:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.is_main else None
        torch_dist.gather_object(obj, out, dst=0)
        return out

    def scatter(self, objs: Sequence[Any] | None) -> Any:
        """Rank r's `objs[r]`, from rank 0's list of one object per rank (the others pass None)."""
        if not self.enabled:
            assert objs is not None
            return objs[0]
        out: list[Any] = [None]
        torch_dist.scatter_object_list(out, list(objs) if self.is_main and objs is not None else None, src=0)
        return out[0]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def wrap(self, model: Any) -> Any:
        """The module the update trains through: DDP over the trainable parameters, or `model` itself alone.

        Without DDP's buffer broadcast before each synchronised forward: a causal LM's buffers (rotary frequencies)
        are the same constants on every rank, and the broadcast is a collective, so ranks whose last micro-batch of a
        minibatch runs a different number of forwards (shared prompts run apart from their completions; replayed
        rows make ranks' micro-batches differ) would wait on each other for ever."""
        if not self.enabled:
            return model
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.local_rank] if next(model.parameters()).device.type == "cuda" else None
        # torch 2.13 names it forward_sync_buffers (and warns on broadcast_buffers); older torch, broadcast_buffers
        named = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        no_sync = {"forward_sync_buffers": False} if named else {"broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=device_ids, **no_sync)


@dataclass
class GatheredStep:
    """What rank 0 holds after a step's gather: every rank's rows, the slowest rank's phase times."""

    rows: list[Any]
    seconds: dict[str, float]


def gather_step(dist: Dist, rows: list[Any], seconds: dict[str, float], adapter_sha256: str) -> GatheredStep | None:
    """Rank 0: every rank's rows (in rank order) and, per phase, the slowest rank's seconds (the step waits for it).

    Also checks that every rank holds the same adapter after the update (it is the one the step commits); sharded
    weights have no replicas to compare ('' from every rank). Other ranks get None.
    """
    gathered = dist.gather((rows, seconds, adapter_sha256))
    if gathered is None:
        return None
    if len({sha for _, _, sha in gathered}) > 1:
        raise RuntimeError("the ranks' adapters diverged after the update")
    names = dict.fromkeys(k for _, rank_seconds, _ in gathered for k in rank_seconds)  # a phase some rank skips
    merged = {k: max(rank_seconds.get(k, 0.0) for _, rank_seconds, _ in gathered) for k in names}
    return GatheredStep([row for rank_rows, _, _ in gathered for row in rank_rows], merged)


def world_size() -> int:
    """The number of ranks torchrun / accelerate describe in the environment (1 when alone)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        return max(1, int(raw))
    except ValueError as exc:
        raise ConfigError(f"WORLD_SIZE must be an integer, got {raw!r}") from exc


ENV_TIMEOUT = "LANPO_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 3600.0  # a rank waits this long in a collective: rank 0's summaries and database work, or
# a slow rank's rollouts, must fit in it; past it the collective raises instead of hanging the job for ever


def dist_timeout() -> timedelta:
    """How long a rank waits in any collective before it fails ($LANPO_DIST_TIMEOUT seconds, default one hour)."""
    raw = os.environ.get(ENV_TIMEOUT, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(
            f"{ENV_TIMEOUT} must be a positive number of seconds, got {raw!r}", hint=f"e.g. {ENV_TIMEOUT}=3600"
        )
    return timedelta(seconds=seconds)


def init_from_env() -> Dist:
    """Join the process group torchrun / accelerate describe in the environment (or run alone)."""
    world = world_size()
    if world <= 1:
        return Dist()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch_dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        torch_dist.init_process_group(backend=process_group_backend(), timeout=dist_timeout())
    return Dist(rank=rank, world=world, local_rank=local_rank)


def process_group_backend() -> str:
    """The process group's backends: on GPUs NCCL for CUDA tensors (FSDP's gathers, DDP's all-reduce) and gloo for
    the CPU tensors lanpo's own collectives carry (the update's summed stats, micro-batch counts); NCCL alone
    refuses a CPU tensor ("No backend type associated with device type cpu", seen on an H200). gloo alone on CPU."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
