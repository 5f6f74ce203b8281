"""What each rank runs in tests/train/test_multirank.py (spawned processes import it by name), and the single-
process side it is compared with. Everything is deterministic from fixed seeds, so every rank builds the same
model and the same global batch and then keeps its strided share, as the trainer does."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from lanpo.train.config import GRPOConfig, LoraConfig, ModelConfig, SFTConfig, TrainConfig
from lanpo.train.consumer.update import UpdateStats, update_policy, warmup_schedule
from lanpo.train.forward.batch import build_batch
from lanpo.train.plumbing import fsdp
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import FullPolicy, LoraPolicy, Policy, load_base, load_policy

PROMPTS, N = 16, 2  # 16 prompts x 2 rollouts = 32 sequences
GRPO = GRPOConfig(learning_rate=1e-2, warmup_ratio=0.0, beta=0.05, minibatch_size=16, micro_batch_size=3)
# Log-probs a chunk of 4 positions at a time, micro-batches of at most 14 real tokens: at 2 ranks the ranks' counts
# of micro-batches differ (7 and 8 in the first minibatch), so the shorter rank runs fillers.
CHUNKED = {"logprob_chunk_tokens": 4, "max_tokens_per_micro_batch": 14}


def policy() -> tuple[Any, Any]:
    """The tiny policy with its LoRA B perturbed (so A gets a gradient too), the same in every process."""
    torch.set_num_threads(1)
    model, tokenizer = load_policy(ModelConfig(name="tiny-random", threads=1), LoraConfig(r=4, alpha=8), seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model, tokenizer


def global_rollouts() -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """PROMPTS x N sequences (prompt ids, completion ids) of uneven lengths, and group-centred advantages."""
    generator = torch.Generator().manual_seed(2)
    prompts, completions = [], []
    for _ in range(PROMPTS):
        prompt = torch.randint(5, 90, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        for _ in range(N):
            length = int(torch.randint(1, 7, (1,), generator=generator))
            prompts.append(prompt.tolist())
            completions.append(torch.randint(5, 90, (length,), generator=generator).tolist())
    advantages = torch.randn(PROMPTS, N, generator=generator)
    return prompts, completions, (advantages - advantages.mean(dim=1, keepdim=True)).flatten()


def share(rank: int, world: int) -> list[int]:
    """Sequence indices of the prompts rank `rank` takes (r, r + W, ...), group by group."""
    return [p * N + j for p in range(rank, PROMPTS, world) for j in range(N)]


def grpo_update(rank: int, world: int, chunked: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """One GRPO update of the LoRA policy on this rank's share; returns the trainable weights and optimizer steps.
    `chunked`: the log-probs in chunks, the micro-batches by a token budget (`CHUNKED`)."""
    model, _ = policy()
    dist = Dist(rank=rank, world=world)
    _, steps = _update(LoraPolicy(model, dist), rank, world, replace(GRPO, **CHUNKED) if chunked else GRPO)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, steps


def full_policy(dist: Dist, checkpointing: bool = False, compute: torch.dtype | None = None) -> FullPolicy:
    """The tiny model with every weight trainable (FSDP-sharded at world > 1, in mixed precision when `compute` is
    bf16), the same start in every process."""
    torch.set_num_threads(1)
    model, tokenizer = load_base(ModelConfig(name="tiny-random", threads=1, gradient_checkpointing=checkpointing))
    return FullPolicy(model, tokenizer, dist, compute)


def full_update(
    rank: int, world: int, checkpointing: bool = False, chunked: bool = False
) -> tuple[dict[str, torch.Tensor], UpdateStats, int]:
    """One GRPO update of every weight on this rank's share: all weights (full, on rank 0), its stats, its steps.

    The stats carry the gradient's norm before clipping: Adam's step hardly changes when the gradient is scaled,
    the norm does."""
    policy = full_policy(Dist(rank=rank, world=world), checkpointing)
    # A sharded model runs every row whole (lanpo.train.forward.batch.can_share); the single process does the same.
    cfg = replace(GRPO, share_prompts=False, **(CHUNKED if chunked else {}))
    stats, steps = _update(policy, rank, world, cfg)
    return fsdp.full_state(policy.model), stats, steps


# Mixed precision (tests/train/test_mixed_precision.py): bf16 compute, one row a micro-batch (a row's bf16 gradient
# is then the same computation whichever rank or process runs it); SGD_LR for the runs held against fp32.
MIXED = replace(GRPO, share_prompts=False, micro_batch_size=1, autocast="bf16")
SGD_LR = 1e-3


def mixed_update(rank: int, world: int) -> dict[str, Any]:
    """The FSDP2 mixed-precision update of every weight on this rank's share, with AdamW and with SGD (full weights
    on rank 0, stats, steps each), and whether a sharded forward gave bit for bit the logits of the unsharded
    start with its parameters cast to bf16 (`forward_exact`)."""
    prompts, completions, _ = global_rollouts()
    mine = share(rank, world)
    batch = build_batch([prompts[i] for i in mine], [completions[i] for i in mine], 0, torch.device("cpu"))
    out: dict[str, Any] = {}
    for name in ("adamw", "sgd"):
        policy = full_policy(Dist(rank=rank, world=world), compute=torch.bfloat16)
        if name == "adamw":
            plain = full_policy(Dist()).model
            for p in plain.parameters():  # FSDP casts the parameters, not the buffers (the rotary frequencies)
                p.data = p.data.to(torch.bfloat16)
            with torch.no_grad():
                sharded = policy.reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                unsharded = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            out["forward_exact"] = sharded.dtype == torch.bfloat16 and torch.equal(sharded, unsharded)
        stats, steps = _update(policy, rank, world, MIXED, sgd=name == "sgd")
        out[name] = (fsdp.full_state(policy.model), stats, steps)
    return out


def _update(
    trained: Policy, rank: int, world: int, cfg: GRPOConfig = GRPO, sgd: bool = False
) -> tuple[UpdateStats, int]:
    prompts, completions, advantages = global_rollouts()
    mine = share(rank, world)
    batch = build_batch([prompts[i] for i in mine], [completions[i] for i in mine], 0, torch.device("cpu"))
    params = trained.trainable_parameters()
    optimizer = torch.optim.SGD(params, lr=SGD_LR) if sgd else torch.optim.AdamW(params, lr=cfg.learning_rate)
    scheduler = warmup_schedule(optimizer, 10, 0.0)
    dist = Dist(rank=rank, world=world)
    stats = update_policy(trained, optimizer, scheduler, batch, advantages[mine], cfg, seed=0, dist=dist)
    return stats, scheduler.last_epoch


SFT_PAIRS = [
    {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}, {"role": "assistant", "content": str(a + b)}]}
    for a, b in [(1, 2), (3, 4), (10, 7), (2, 2), (5, 9), (8, 1), (6, 6), (4, 11), (7, 3)]
]  # 9 pairs: batches of 4, 4 and 1 (a rank without a pair of its own in the last one)


def sft_config(out: Path, micro_batch_size: int = 0) -> TrainConfig:
    return TrainConfig(
        run_name="sft-ranks",
        output_dir=str(out),
        model=ModelConfig(name="tiny-random", threads=1),
        lora=LoraConfig(r=4, alpha=8),
        sft=SFTConfig(
            enabled=True, learning_rate=5e-3, epochs=2, batch_size=4, max_length=64, micro_batch_size=micro_batch_size
        ),
    )


def sft(
    rank: int, world: int, out: Path, ddp: bool, micro_batch_size: int = 0
) -> tuple[dict[str, torch.Tensor], list[float]]:
    from lanpo.train.sft.warm_start import run_sft

    model, tokenizer = policy()
    dist = Dist(rank=rank, world=world)
    result = run_sft(
        sft_config(out, micro_batch_size), SFT_PAIRS, policy=(model, tokenizer), dist=dist,
        ddp=dist.wrap(model) if ddp else None,
    )  # fmt: skip
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, result.losses


def worker(rank: int, world: int, store: str, job: str, out: str) -> None:
    """A spawned rank: join the gloo group, run `job`, rank 0 saves what it got to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1")
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        if job.startswith("grpo"):  # "grpo", or "grpo-chunked"
            result: Any = grpo_update(rank, world, chunked=job == "grpo-chunked")
        elif job == "full-mixed":
            result = mixed_update(rank, world)
        elif job.startswith("full"):  # "full", "full-checkpointing" or "full-chunked"
            result = full_update(rank, world, checkpointing=job == "full-checkpointing", chunked=job == "full-chunked")
        else:  # "sft", or "sft-micro": one pair per forward, gradients accumulated
            result = sft(rank, world, Path(out).parent, ddp=True, micro_batch_size=1 if job == "sft-micro" else 0)
        if rank == 0:
            torch.save(result, out)
    finally:
        torch_dist.destroy_process_group()
