"""The NLL term's multi-rank check (spawned ranks import this module by name): ranks hold different numbers of
NLL examples -- rank 0 all of them, the others none -- and after one update the weights equal one process's."""

from __future__ import annotations

import os
from dataclasses import replace

import torch
import torch.distributed as torch_dist

from lanpo.train.consumer.update import NLLTerm, update_policy, warmup_schedule
from lanpo.train.forward.batch import build_batch
from lanpo.train.plumbing import fsdp
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import LoraPolicy
from tests.train import multirank_workers as grpo

LAMBDA = 0.5


def nll_examples() -> tuple[list[list[int]], list[list[int]]]:
    """Three (prompt, target) examples of uneven lengths."""
    generator = torch.Generator().manual_seed(7)
    prompts, targets = [], []
    for length in (4, 2, 6):
        prompts.append(torch.randint(5, 90, (3 + length % 3,), generator=generator).tolist())
        targets.append(torch.randint(5, 90, (length,), generator=generator).tolist())
    return prompts, targets


def update(rank: int, world: int, ddp: bool) -> dict[str, torch.Tensor]:
    """One GRPO + lambda * NLL update on this rank's share of the rollouts; rank 0 holds every NLL example."""
    model, _ = grpo.policy()
    prompts, completions, advantages = grpo.global_rollouts()
    mine = grpo.share(rank, world)
    batch = build_batch([prompts[i] for i in mine], [completions[i] for i in mine], 0, torch.device("cpu"))
    nll_batch = build_batch(*nll_examples(), 0, torch.device("cpu")) if rank == 0 else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=grpo.GRPO.learning_rate)
    dist = Dist(rank=rank, world=world)
    update_policy(
        LoraPolicy(model, dist if ddp else None),  # DDP over the adapter when ddp
        optimizer,
        warmup_schedule(optimizer, 10, 0.0),
        batch,
        advantages[mine],
        grpo.GRPO,
        seed=0,
        dist=dist,
        nll=NLLTerm(nll_batch, LAMBDA),
    )
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def update_full(rank: int, world: int) -> dict[str, torch.Tensor]:
    """The same update of every weight, FSDP-sharded at world > 1 (every forward a collective), rank 0 holding every
    NLL example: the other ranks run zero-weight forwards to keep the collectives in step."""
    policy = grpo.full_policy(Dist(rank=rank, world=world))
    prompts, completions, advantages = grpo.global_rollouts()
    mine = grpo.share(rank, world)
    batch = build_batch([prompts[i] for i in mine], [completions[i] for i in mine], 0, torch.device("cpu"))
    nll_batch = build_batch(*nll_examples(), 0, torch.device("cpu")) if rank == 0 else None
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=grpo.GRPO.learning_rate)
    update_policy(
        policy, optimizer, warmup_schedule(optimizer, 10, 0.0), batch, advantages[mine],
        replace(grpo.GRPO, share_prompts=False, micro_batch_size=1), seed=0, dist=Dist(rank=rank, world=world),
        nll=NLLTerm(nll_batch, LAMBDA),
    )  # fmt: skip
    return fsdp.full_state(policy.model)


def worker(rank: int, world: int, store: str, out: str, job: str = "lora") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1")
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = update(rank, world, ddp=True) if job == "lora" else update_full(rank, world)
        if rank == 0:
            torch.save(result, out)
    finally:
        torch_dist.destroy_process_group()
