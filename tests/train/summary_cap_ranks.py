"""Spawned gloo ranks for tests/train/test_summary_cap.py: each takes its strided share of a step's successful
rollouts and keeps what `choose_for_step` gives it (this module imports little, so that a rank starts fast)."""

from __future__ import annotations

import os
import random

import torch
import torch.distributed as torch_dist

from lanpo.feedback.summarize import Candidate
from lanpo.train.plumbing.dist import Dist
from lanpo.train.producer.summarize import choose_for_step

PAPER_CAP = 8  # LANPO appendix 9.2: "the maximum number of feedback saved in each step to be 8"


def step_candidates(problems: list[int], n: int, rng: random.Random, succeed: float = 0.6) -> list[Candidate]:
    """The successful rollouts of a step whose prompts are `problems` (in the step's order), n rollouts each:
    rewards 1.0 or 1.1 (the format bonus), some responses repeated within a problem."""
    out = []
    for g, pid in enumerate(problems):
        for j in range(n):
            if rng.random() < succeed:
                response = f"solution {rng.randrange(3)} of problem {pid}"  # three distinct texts at most
                out.append(Candidate(g * n + j, pid, f"q{pid}", response, rng.choice([1.0, 1.1])))
    return out


def worker(rank: int, world: int, store: str, out: str) -> None:
    """A spawned rank: join the gloo group, choose in every case of `cases`, rank 0 saves each rank's picks."""
    os.environ.update(MASTER_ADDR="127.0.0.1")
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        dist = Dist(rank=rank, world=world)
        got = {}
        for name, (candidates, total) in cases(world).items():
            mine = [c for c in candidates if (c.index // 4) % world == rank]  # rank r holds groups r, r + W, ...
            got[name] = [c.index for c in choose_for_step(dist, mine, PAPER_CAP, total)]
        everyone = dist.gather(got)
        if rank == 0:
            torch.save(everyone, out)
    finally:
        torch_dist.destroy_process_group()


def cases(world: int) -> dict[str, tuple[list[Candidate], int]]:
    """The whole step's candidates (4 rollouts a prompt) and the total cap: successes spread over the ranks, all on
    one rank, and no total (each rank chooses alone)."""
    rng = random.Random(world)
    spread = step_candidates(rng.sample(range(1000), 12), 4, rng)
    lopsided = [c for c in step_candidates(list(range(12)), 4, rng, succeed=1.0) if (c.index // 4) % world == 1]
    return {"spread": (spread, PAPER_CAP), "one rank succeeds": (lopsided, PAPER_CAP), "no total": (spread, 0)}
