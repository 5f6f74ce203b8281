"""What each rank runs in tests/train/test_replay_ranks.py (spawned processes import it by name), and the single-
process side it is compared with: tests/train/multirank_workers.py's rollouts and tiny LoRA policy, with stored
trajectories joined to some of its groups, unevenly (rank 0 holds more replayed rows than rank 1, and group 14's
replays train in the second minibatch). Everything is deterministic from fixed seeds."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as torch_dist

from lanpo.train.consumer.replay_rows import ReplayRows
from lanpo.train.consumer.update import update_policy, warmup_schedule
from lanpo.train.forward.batch import RolloutBatch, build_batch
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import LoraPolicy
from lanpo.train.replay import rank_share
from tests.train import multirank_workers as w

REPLAYED_GROUPS = [0, 0, 3, 5, 6, 6, 11, 14]  # the global group each stored trajectory joins (rank 0: 5 rows, 1: 3)
GROUPS = w.PROMPTS


def stored_rows() -> list[tuple[int, tuple[list[int], list[float], float]]]:
    """(global group, (completion ids, behaviour log-probs, advantage)) of each replayed row."""
    generator = torch.Generator().manual_seed(3)
    rows = []
    for g in REPLAYED_GROUPS:
        length = int(torch.randint(1, 7, (1,), generator=generator))
        ids = torch.randint(5, 90, (length,), generator=generator).tolist()
        logprobs = (-0.5 - 3.0 * torch.rand(length, generator=generator)).tolist()
        rows.append((g, (ids, logprobs, float(torch.randn(1, generator=generator)))))
    return rows


def replay_batch(rank: int, world: int, correction: str) -> tuple[RolloutBatch, torch.Tensor, ReplayRows]:
    """This rank's fresh rows (its strided share) then its replayed rows (`rank_share`, as the trainer splits them):
    the batch, advantages (B,) and which rows are replayed."""
    prompts, completions, advantages = w.global_rollouts()
    mine = w.share(rank, world)
    local = rank_share(stored_rows(), Dist(rank=rank, world=world))  # (local group, row)
    prompt_ids = [prompts[i] for i in mine] + [prompts[g * world * w.N + rank * w.N] for g, _ in local]
    completion_ids = [completions[i] for i in mine] + [row[0] for _, row in local]
    batch = build_batch(prompt_ids, completion_ids, 0, torch.device("cpu"))
    fresh, width = len(mine), batch.completion_ids.shape[1]
    behaviour = torch.zeros((batch.size, width))
    for b, (_, row) in enumerate(local):
        behaviour[fresh + b, : len(row[1])] = torch.tensor(row[1])
    replayed = torch.arange(batch.size) >= fresh
    group = torch.cat([torch.arange(fresh) // w.N, torch.tensor([g for g, _ in local], dtype=torch.long)])
    rows = ReplayRows(replayed, behaviour, correction, 0.1, group, fresh // w.N)
    adv = torch.cat([advantages[mine], torch.tensor([row[2] for _, row in local])])
    return batch, adv, rows


def update(rank: int, world: int, correction: str, agg: str) -> tuple[dict[str, torch.Tensor], int]:
    """One GRPO update (two minibatches, micro-batches of 3) of the LoRA policy on this rank's fresh and replayed
    rows; returns the trainable weights and the optimizer steps."""
    model, _ = w.policy()
    dist = Dist(rank=rank, world=world)
    policy = LoraPolicy(model, dist)
    batch, advantages, rows = replay_batch(rank, world, correction)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=w.GRPO.learning_rate)
    scheduler = warmup_schedule(optimizer, 10, 0.0)
    cfg = replace(w.GRPO, loss_agg=agg)
    update_policy(policy, optimizer, scheduler, batch, advantages, cfg, seed=0, dist=dist, replay=rows)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, scheduler.last_epoch


JOBS = (("separate", "token-mean"), ("shaped", "seq-mean"))  # each (correction, loss_agg), one process group


def worker(rank: int, world: int, store: str, out: str) -> None:
    """A spawned rank: join the gloo group, run the update of each of `JOBS`, rank 0 saves them."""
    os.environ.update(MASTER_ADDR="127.0.0.1")
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result: Any = {job: update(rank, world, *job) for job in JOBS}
        if rank == 0:
            torch.save(result, out)
    finally:
        torch_dist.destroy_process_group()
