"""The small views of the trainer that a step's phases take, so that each says what it uses.

`RunRef` (lanpo.feedback.store) is where a step's rows go (the store, the run, its pool); `Sampler` is what samples
text on this rank (the engine serving the policy, its tokenizer, the rank's place among the others); `StepStore` is
what the step's commit writes with (the run, the lessons' author, the MEL config, the checkpoint folder it prunes).
`lanpo.train.state.Trainer` hands them out; a phase that takes one never sees the rest (optimizer, schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanpo.feedback.store import RunRef
from lanpo.mel.config import MELConfig
from lanpo.train.plumbing.dist import Dist


@dataclass(frozen=True)
class Sampler:
    """What samples text from the policy on this rank: the engine (`lanpo.train.producer.served_policy.ServedPolicy`),
    its tokenizer, and the rank's place (seeds and shares)."""

    backend: Any
    tokenizer: Any
    dist: Dist


@dataclass(frozen=True)
class StepStore:
    """What a step's commit writes with: where its rows go, the author its lessons are stored under
    (experience_versions.author), the MEL config (None unless method = mel), the checkpoints it prunes (it keeps the
    newest `keep_checkpoints`: `checkpoint.keep`), and the hash of the weights the engine serves for the version it
    commits when they are not the version's own (merged LoRA, `ServedPolicy.served_sha256` after the step's sync;
    else None)."""

    run: RunRef
    summary_author: str
    mel: MELConfig | None
    checkpoint_root: Path
    keep_checkpoints: int
    served_sha256: str | None = None
    max_total_per_step: int = 0  # summarizer.max_total_per_step: the step's lesson cap (0: none)
