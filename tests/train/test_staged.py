"""Weights staged for rollout workers (`lanpo.train.plumbing.staged`): a step between checkpoints writes the policy's
weights alone, atomically, under the hash its checkpoint would record; equal weights share a folder; pruning keeps the
versions of the newest committed steps; and a worker's policy loads them bit for bit, LoRA and full fine-tuning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session

from lanpo.db.repo import runs as runs_repo
from lanpo.db.repo import steps as steps_repo
from lanpo.models import tiny_causal_lm
from lanpo.train.config import LoraConfig
from lanpo.train.plumbing.checkpoint import weights_sha256
from lanpo.train.plumbing.staged import STAGED_DIR, clear, prune_staged, stage_policy, staged_weights
from lanpo.train.policy import Policy, build_policy


def _policy(kind: str) -> Policy:
    model, tokenizer = tiny_causal_lm(seed=0)
    return build_policy(model, tokenizer, LoraConfig(enabled=kind == "lora", r=4, alpha=8), seed=0)


def _move(policy: Policy, seed: int) -> None:
    """An update's stand-in: every trained weight moves (LoRA's B starts at 0, so the adapter changes too)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)


def _trained(policy: Policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_a_staged_version_holds_the_weights_under_the_hash_a_checkpoint_records(tmp_path: Path, kind: str) -> None:
    policy = _policy(kind)
    _move(policy, 1)
    staged = stage_policy(tmp_path, policy)
    assert staged is not None
    folder, sha = staged
    assert folder is None  # a step between checkpoints names no checkpoint folder
    assert sha == policy.save(tmp_path / "checkpoint-like", None)  # what save_checkpoint would record
    weights = staged_weights(tmp_path, sha, kind)
    assert weights_sha256(weights, kind) == sha  # what a worker checks before it loads
    assert [p.name for p in (tmp_path / STAGED_DIR).iterdir()] == [sha]  # renamed into place, no temporary left

    worker = _policy(kind)  # a worker's policy, at the start
    trained = _trained(policy)
    assert any(not torch.equal(p, trained[k]) for k, p in _trained(worker).items())
    worker.load(weights)
    loaded = _trained(worker)
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)

    # the same weights again (a step that did not move them): the folder a worker may be reading is left alone
    written = (weights.parent.stat().st_ino, weights.parent.stat().st_mtime_ns)
    assert stage_policy(tmp_path, policy) == (None, sha)
    assert (weights.parent.stat().st_ino, weights.parent.stat().st_mtime_ns) == written
    _move(policy, 2)
    newer = stage_policy(tmp_path, policy)
    assert newer is not None and newer[1] != sha
    assert sorted(p.name for p in (tmp_path / STAGED_DIR).iterdir()) == sorted([sha, newer[1]])


def test_pruning_keeps_the_newest_committed_versions_and_a_restart_clears_them(session: Session, tmp_path: Path):
    run = runs_repo.create_run(session, "staged", "train").id
    hashes = [f"{i:x}" * 64 for i in range(1, 6)]  # steps 0..4, each its own version
    for step, sha in enumerate(hashes):
        steps_repo.commit_step(session, run, step, steps_repo.add_policy_version(session, run, step, sha))
    keep = steps_repo.newest_versions(session, run, 2)
    assert keep == [hashes[4], hashes[3]]
    for sha in hashes:
        (tmp_path / STAGED_DIR / sha / "adapter").mkdir(parents=True)
    (tmp_path / STAGED_DIR / ".tmp-12345").mkdir()  # a killed trainer's half-written version
    removed = prune_staged(tmp_path, set(keep))
    assert len(removed) == 4 and sorted(p.name for p in (tmp_path / STAGED_DIR).iterdir()) == sorted(keep)
    assert len(clear(tmp_path)) == 2 and list((tmp_path / STAGED_DIR).iterdir()) == []
    assert clear(tmp_path / "no-run-here") == []
