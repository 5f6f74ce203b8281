"""Policy versions staged for rollout workers: the weights of each committed step that no checkpoint holds.

A rollout worker serves the newest committed policy version (`lanpo.train.producer.worker`). A checkpointed step's
weights are in its checkpoint; between checkpoints (`checkpoint.every > 1`) the trainer writes the step's weights
alone to `<output_dir>/staged/<sha256>/adapter` (LoRA) or `.../model` (full fine-tuning) before the step's
transaction commits, so a worker that reads the step from the store finds them. Weights only: no optimizer state,
schedule nor RNG, so a LoRA adapter costs a few MB a step and full fine-tuning one full write of the weights (the
checkpoint's optimizer moments, twice the weights in fp32, are not written). Only with workers: no one else reads
them.

- Named by the policy version's hash, which the worker checks again on the folder it loads: equal weights of two
  steps share one folder, and a name never holds other weights.
- Atomic: written under a temporary name and renamed into place. No fsync: a staged version is never read after a
  crash, since the resume rolls back to the last checkpoint and clears the folder (`clear`).
- Kept: the versions of the newest `KEEP` committed steps, pruned after each commit. A worker that reads a version
  pruned before it opens the folder loads the newer one the store publishes, as with `checkpoint.keep`.
- A resume clears the folder: the versions staged by the committed steps it rolls back are gone with their rows,
  and a redone step stages its own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanpo.train.plumbing.checkpoint import WEIGHTS_DIR
from lanpo.train.plumbing.dist import Dist

if TYPE_CHECKING:
    from lanpo.train.policy import Policy

STAGED_DIR = "staged"  # in the run's output_dir
KEEP = 2  # the newest committed steps whose staged weights stay: the one workers load, and the one before it


def staged_weights(root: Path, sha256: str, kind: str) -> Path:
    """Where the staged weights of policy version `sha256` are (`kind`: the policy's, lora | full)."""
    return root / STAGED_DIR / sha256 / WEIGHTS_DIR[kind]


def stage_policy(
    root: Path, policy: Policy, start: dict[str, Any] | None = None, dist: Dist | None = None
) -> tuple[None, str] | None:
    """Write the policy's weights to `root/staged/<sha256>/`; what a step between checkpoints commits: (None, the
    policy version's hash) on rank 0, None on the others. Every rank calls it (FSDP gathers the full weights onto
    rank 0, as for a checkpoint); rank 0 alone writes. The hash is the one a checkpoint of these weights records."""
    dist = dist or Dist()
    folder = root / STAGED_DIR
    tmp = folder / f".tmp-{os.getpid()}"
    if dist.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    sha = policy.save(tmp / WEIGHTS_DIR[policy.kind], start)
    if sha is None:  # not rank 0: it only sent its shards
        return None
    final = folder / sha
    if final.exists():  # an earlier step's weights, equal bit for bit: a worker may be reading them, leave them
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, final)
    return None, sha


def prune_staged(root: Path, keep: set[str]) -> list[Path]:
    """Delete the staged versions whose hash is not in `keep` (and a killed trainer's temporary folders)."""
    folder = root / STAGED_DIR
    if not folder.is_dir():
        return []
    removed = [path for path in folder.iterdir() if path.name not in keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def clear(root: Path) -> list[Path]:
    """Delete every staged version: a (re)starting trainer's, before any step is published again."""
    return prune_staged(root, set())
