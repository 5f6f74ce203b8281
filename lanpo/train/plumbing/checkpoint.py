"""Checkpoints: the policy's weights + optimizer + scheduler + RNG states + step, written atomically (tmp dir, rename).

A checkpoint `step-000007/` is written BEFORE the database transaction of step 7 commits; the `run_steps` row
names it. On resume the database decides: the last checkpointed step's checkpoint is loaded and anything newer on
disk (a crash between rename and commit) is ignored and later overwritten.

Cadence (`[checkpoint]`): a checkpoint every `every` steps and at the last step, the newest `keep` kept. The store
still commits every step (a step between checkpoints names no folder, and its policy version carries the hash of
the live weights, `unsaved_version`). So a crash can leave committed steps c+1..d past the last checkpoint c, and a
resume rolls the store back to c in one transaction: the rows of steps > c, and the evictions they made
(`experiences.evicted_step`, migration 0013), so that step c+1 draws from the pool as it stood after step c and no
attempt is doubled. Why not hold each step's commit back until a checkpoint covers it: the next step samples its
contexts from the pool in the store (its lessons, their relevance, the caps' evictions), so the store would have
to keep k steps in one open transaction that nothing else sees; `lanpo sql`, `lanpo runs`, the rollout queue and the
run_metrics a researcher reads as the run goes would all lag k steps. Rolling back costs at most `every - 1`
redone steps after a crash, and the rows a researcher queries are always those of steps the weights went through
(the TRL integration rolls back to TRL's checkpoint the same way). With rollout workers, which load the policy they
serve from disk, a step between checkpoints writes its weights alone for them (`lanpo.train.plumbing.staged`).

The weights are the policy's (`lanpo.train.policy`): `adapter/` for a LoRA policy, `model/` (a whole model folder,
safetensors) under full fine-tuning. Every rank takes part in a save (FSDP gathers its shards onto rank 0) and
rank 0 alone writes.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lanpo.errors import InputError
from lanpo.models.hashing import adapter_dir_sha256, model_dir_sha256, state_sha256
from lanpo.train.plumbing.dist import Dist

if TYPE_CHECKING:
    from lanpo.train.policy import Policy

STATE_FILE = "trainer_state.pt"
ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
WEIGHTS_DIR = {"lora": ADAPTER_DIR, "full": MODEL_DIR}  # the policy's kind -> its weights' folder


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def weights_sha256(weights: Path, kind: str) -> str:
    """The policy version's hash of a saved weights folder (`adapter/`, `model/`), as `Policy.save` returned it when
    it wrote the folder: a rollout worker checks it before it loads them."""
    return adapter_dir_sha256(weights) if kind == "lora" else model_dir_sha256(weights)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    policy: Policy,
    optimizer: Any,
    scheduler: Any,
    start: dict[str, Any] | None = None,
    dist: Dist | None = None,
) -> tuple[Path, str] | None:
    """Write `root/step-NNNNNN` atomically; returns (its path, the policy's sha256) on rank 0, None on the others.

    `start` (the model and start adapter RL began from) goes next to a LoRA adapter as `lanpo_start.json`,
    so `lanpo infer --adapter step-NNNNNN/adapter` rebuilds the same base before attaching it.
    """
    dist = dist or Dist()
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    sha = policy.save(tmp / WEIGHTS_DIR[policy.kind], start)
    optimizer_state = policy.optimizer_state(optimizer)
    if sha is None:  # not rank 0: it only sent its shards
        return None
    torch.save(
        {
            "step": step,
            "policy": policy.kind,
            "adapter_sha256": sha,  # the policy version's hash: the adapter's, or all weights' under full fine-tuning
            "optimizer": optimizer_state,
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
        },
        tmp / STATE_FILE,
    )
    _fsync_tree(tmp)
    if final.exists():  # left by a crash after rename and before the DB commit: the DB never saw it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final, sha


def unsaved_version(policy: Policy, dist: Dist | None = None, synced: str | None = None) -> tuple[None, str] | None:
    """What a step between checkpoints commits instead of `save_checkpoint`'s (path, sha): (None, the policy
    version's hash) on rank 0, None on the others; every rank calls it.

    A LoRA adapter's hash is the one its checkpoint would record (`adapter_sha256`). Under full fine-tuning a vLLM
    engine that loaded the step's weights (`synced`, what `ServedPolicy.sync` returned) hashed them under the
    checkpoint's names, as `model_dir_sha256` of a checkpoint would; with no engine of its own there is no folder
    to hash, so the version is the hash of the live weights (`state_sha256`): of the whole state dict in one
    process, or sharded (FSDP) the hash of every rank's shard hash in rank order (no rank gathers the full weights
    for it). Each names these weights and no others.
    """
    dist = dist or Dist()
    if policy.kind == "full" and synced is not None:
        return (None, synced) if dist.is_main else None
    if policy.kind == "lora" or not dist.enabled:
        return (None, policy.replica_sha256()) if dist.is_main else None
    local = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in policy.model.state_dict().items()}
    shards = dist.gather(state_sha256(local))
    if shards is None:
        return None
    return None, hashlib.sha256("".join(shards).encode()).hexdigest()


@dataclass
class LoadedCheckpoint:
    step: int
    adapter_sha256: str
    path: Path


def load_checkpoint(path: Path, policy: Policy, optimizer: Any, scheduler: Any) -> LoadedCheckpoint:
    """Load the policy's weights, optimizer, scheduler and RNG states from `path` into the live objects."""
    state_file = path / STATE_FILE
    incomplete = InputError(
        f"checkpoint {path} is incomplete or missing",
        hint="the database names this checkpoint as committed; restore the run folder or start a new run_name",
    )
    if not state_file.exists():
        raise incomplete
    state = torch.load(state_file, map_location="cpu", weights_only=False)
    saved_kind = state.get("policy", "lora")  # checkpoints written before full fine-tuning hold adapters
    if saved_kind != policy.kind:
        saved = "a LoRA adapter" if saved_kind == "lora" else "fully fine-tuned weights"
        raise InputError(
            f"checkpoint {path} holds {saved}, but this config trains "
            f"{'a LoRA adapter' if policy.kind == 'lora' else 'every weight'}",
            hint=f"resume with lora.enabled = {'true' if saved_kind == 'lora' else 'false'}, as the run started",
        )
    weights = path / WEIGHTS_DIR[policy.kind]
    if not weights.exists():
        raise incomplete
    policy.load(weights)
    policy.load_optimizer_state(optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return LoadedCheckpoint(step=int(state["step"]), adapter_sha256=str(state["adapter_sha256"]), path=path)


def prune_checkpoints(root: Path, keep: int, protect: int) -> list[Path]:
    """Delete all but the newest `keep` step folders up to `protect` (the last committed step); newer are left."""
    steps = sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if p.name.split("-")[1].isdigit())
    committed = [s for s in steps if s <= protect]
    removed = []
    for s in committed[:-keep] if keep else committed:
        if s == protect:
            continue
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
        removed.append(step_dir(root, s))
    return removed


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
