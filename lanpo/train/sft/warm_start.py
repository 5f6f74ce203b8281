"""The SFT warm start: chat pairs for the answer format and the three atomic skills, trained into a LoRA adapter.

The pairs come from `lanpo.train.sft.pairs` (built from worked solutions; their names are re-exported here) or
from a JSONL file (`lanpo.train.sft.teacher` writes one). Loss is on the assistant turn only. The adapter is a valid
`model.init_adapter` for GRPO.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lanpo.errors import InputError
from lanpo.models import apply_chat
from lanpo.paths import output_dir
from lanpo.train.config import TrainConfig
from lanpo.train.plumbing.dist import Dist
from lanpo.train.policy import load_policy
from lanpo.train.sft.pairs import (
    Message,
    expression_steps,
    lesson_for,
    lessons_for,
    problems_for_sft,
    read_pairs,
    sft_pairs,
    worked_solution,
    write_pairs,
)

# The data-building names, importable from here as before.
__all__ = [
    "SFTResult",
    "expression_steps",
    "lesson_for",
    "lessons_for",
    "problems_for_sft",
    "read_pairs",
    "run_sft",
    "sft_pairs",
    "worked_solution",
    "write_pairs",
]


@dataclass
class SFTResult:
    adapter_dir: Path
    losses: list[float] = field(default_factory=list)
    pairs: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------- training


def tokenize_pair(tokenizer: Any, messages: list[Message], max_length: int) -> tuple[list[int], list[int]]:
    """(input ids, labels) with the prompt masked to -100; truncated to max_length from the left of the prompt."""
    prompt = apply_chat(tokenizer, messages[:-1], add_generation_prompt=True)
    full = apply_chat(tokenizer, messages, add_generation_prompt=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    if len(full_ids) > max_length:
        cut = len(full_ids) - max_length
        full_ids, labels = full_ids[cut:], labels[cut:]
    return full_ids, labels


def _padded(chunk: Sequence[tuple[list[int], list[int]]], pad: int, device: Any) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, labels), each (b, L)."""
    L = max(len(ids) for ids, _ in chunk)
    input_ids = torch.full((len(chunk), L), pad, dtype=torch.long)
    labels = torch.full((len(chunk), L), -100, dtype=torch.long)
    attention = torch.zeros((len(chunk), L), dtype=torch.long)
    for row, (ids, lab) in enumerate(chunk):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(lab)] = torch.tensor(lab)
        attention[row, : len(ids)] = 1
    return input_ids.to(device), attention.to(device), labels.to(device)


def nll_sum(model: Any, input_ids: torch.Tensor, attention: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token negative log-likelihood of the labelled (not -100) tokens: a scalar."""
    logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits[:, :-1, :]  # (b, L-1, V)
    target = labels[:, 1:]  # (b, L-1): position t predicts token t + 1
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
    )


def run_sft(
    config: TrainConfig,
    data: str | Path | Sequence[dict[str, Any]] | None = None,
    db: Any = None,
    out_dir: str | Path | None = None,
    progress: bool = False,
    policy: tuple[Any, Any] | None = None,
    dist: Dist | None = None,
    ddp: Any = None,
) -> SFTResult:
    """Train a LoRA adapter on chat pairs (a JSONL path, a list of pairs, or None: built from `data.task`).

    `policy` = (PEFT model, tokenizer) trains that live adapter in place (the trainer's warm start) instead of
    loading a fresh copy of the model. Under data parallelism (`dist`, `ddp` = the DDP module over `model`) every
    rank takes its strided share of each batch of `sft.batch_size` pairs and the loss is the token-mean over the
    whole batch, so the adapter equals the single process's; rank 0 alone writes it (and records the run).
    """
    dist = dist or Dist()
    started = time.perf_counter()
    target = output_dir(out_dir if out_dir else config.checkpoint_root() / "sft", "SFT output folder")
    pairs = _pairs(config, data)
    sft = config.sft
    model, tokenizer = policy if policy is not None else load_policy(config.model, config.lora, seed=config.seed)
    trained = ddp if ddp is not None else model
    device = next(model.parameters()).device
    encoded = [tokenize_pair(tokenizer, p["messages"], sft.max_length) for p in pairs]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=sft.learning_rate, weight_decay=0.0)
    total = sft.epochs * -(-len(encoded) // sft.batch_size)
    if sft.max_steps:
        total = min(total, sft.max_steps)
    from lanpo.train.consumer.update import warmup_schedule

    scheduler = warmup_schedule(optimizer, total, 0.1)
    rng = random.Random(sft.seed)  # the same order on every rank
    losses: list[float] = []
    model.train()
    bar = None
    if progress and dist.is_main:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="lanpo sft", unit="step", dynamic_ncols=True)
    for _epoch in range(sft.epochs):
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for start in range(0, len(order), sft.batch_size):
            if len(losses) >= total:
                break
            chunk = [encoded[i] for i in order[start : start + sft.batch_size]]  # the whole batch, every rank
            optimizer.zero_grad(set_to_none=True)
            summed, tokens = _backward(trained, ddp, chunk, sft.micro_batch_size, tokenizer.pad_token_id, device, dist)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(dist.all_reduce_sum(summed.detach().clone()) / tokens))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    adapter_dir = target / "adapter"
    if dist.is_main:
        model.save_pretrained(adapter_dir)
    result = SFTResult(adapter_dir=adapter_dir, losses=losses, pairs=len(pairs), seconds=time.perf_counter() - started)
    if db is not None and dist.is_main:
        _record(db, config, result)
    return result


def _pairs(config: TrainConfig, data: str | Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The SFT pairs: read from a JSONL path, given as a list, or (None) built from the recipe's problems."""
    if data is None:
        pairs = sft_pairs(problems_for_sft(config), seed=config.sft.seed, skill_problems=config.sft.skill_problems)
    elif isinstance(data, str | Path):
        pairs = read_pairs(data)
    else:
        pairs = list(data)  # type: ignore[arg-type]
    if not pairs:
        raise InputError("no SFT pairs (no problem had a worked solution)")
    return pairs


def _backward(
    trained: Any, ddp: Any, chunk: list[Any], micro_batch_size: int, pad_token_id: int, device: Any, dist: Dist
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of one batch `chunk` (every rank's pairs, encoded): this rank's share, its loss scaled to the
    token-mean over the whole batch; returns (this rank's summed NLL, the batch's predicted tokens)."""
    mine = dist.share(chunk)
    share, weight = (mine, 1.0) if mine else (chunk[:1], 0.0)  # no pair of its own: still in the all-reduce
    labelled = weight * sum(sum(t != -100 for t in lab[1:]) for _, lab in share)  # tokens predicted
    tokens = dist.all_reduce_sum(torch.tensor(float(labelled))).clamp(min=1.0)
    summed = torch.zeros(())
    micro = micro_batch_size or len(share)
    pieces = [share[i : i + micro] for i in range(0, len(share), micro)]
    for i, piece in enumerate(pieces):  # gradient accumulation: the sum over pieces is the batch's
        # DDP all-reduces on each rank's last backward only (once per rank, however many pieces it has)
        sync = i == len(pieces) - 1 or ddp is None
        with nullcontext() if sync else ddp.no_sync():
            part = nll_sum(trained, *_padded(piece, pad_token_id, device)) * weight
            (part / tokens * dist.world).backward()  # DDP averages the ranks' gradients: the batch's mean
        summed = summed + part.detach()
    return summed, tokens


def _record(db: Any, config: TrainConfig, result: SFTResult) -> None:
    """An `sft` run with its loss curve in run_metrics (name `<run_name>-sft`, suffixed if taken)."""
    from lanpo.config import to_mapping
    from lanpo.db.connection import transaction
    from lanpo.db.repo import runs as runs_repo

    with transaction(db) as session:
        name = runs_repo.free_name(session, f"{config.run_name}-sft")
        run = runs_repo.create_run(session, name, "sft", to_mapping(config), config.model.name)
        for step, loss in enumerate(result.losses, start=1):
            runs_repo.record_metrics(session, run.id, step, {"sft/loss": loss})
        runs_repo.finish_run(session, run.id, "finished")
