"""Checkpoints: adapter + optimizer + scheduler + RNG states + step, written atomically (tmp dir, then rename).

A checkpoint `step-000007/` is written BEFORE the database transaction of step 7 commits; the `run_steps` row
names it. On resume the database decides: the last committed step's checkpoint is loaded and anything newer on
disk (a crash between rename and commit) is ignored and later overwritten.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lanpo.errors import InputError
from lanpo.models import adapter_sha256, write_start

STATE_FILE = "trainer_state.pt"
ADAPTER_DIR = "adapter"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


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
    root: Path, step: int, model: Any, optimizer: Any, scheduler: Any, start: dict[str, Any] | None = None
) -> tuple[Path, str]:
    """Write `root/step-NNNNNN` atomically; returns (its path, the adapter's sha256).

    `start` (the model and start adapter RL began from) goes next to the adapter's weights as `lanpo_start.json`,
    so `lanpo infer --adapter step-NNNNNN/adapter` rebuilds the same base before attaching it.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / ADAPTER_DIR)
    if start is not None:
        write_start(tmp / ADAPTER_DIR, start)
    sha = adapter_sha256(model)
    torch.save(
        {
            "step": step,
            "adapter_sha256": sha,
            "optimizer": optimizer.state_dict(),
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


@dataclass
class LoadedCheckpoint:
    step: int
    adapter_sha256: str
    path: Path


def load_adapter_weights(model: Any, adapter_dir: Path) -> None:
    """Copy a saved adapter's weights into the live PEFT model (same LoRA shape)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = Path(adapter_dir) / "adapter_model.safetensors"
    if not weights.exists():
        raise InputError(f"no adapter weights in {adapter_dir}")
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_file(str(weights), device=str(device)))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise InputError(
            f"adapter in {adapter_dir} does not fit this model ({len(unexpected)} unexpected keys)",
            hint="use the same lora.r / lora.target_modules as when it was saved",
        )


def load_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any) -> LoadedCheckpoint:
    """Load adapter weights, optimizer, scheduler and RNG states from `path` into the live objects."""
    state_file = path / STATE_FILE
    if not state_file.exists() or not (path / ADAPTER_DIR).exists():
        raise InputError(
            f"checkpoint {path} is incomplete or missing",
            hint="the database names this checkpoint as committed; restore the run folder or start a new run_name",
        )
    device = next(model.parameters()).device
    load_adapter_weights(model, path / ADAPTER_DIR)
    state = torch.load(state_file, map_location=device, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
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
